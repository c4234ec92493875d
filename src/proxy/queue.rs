//! Admit (request queue): an attempt on a connection whose per-connection limiter is on
//! (ARCHITECTURE §6: `RATE_LIMIT_AUTO_ENABLE` / `auto_enable_api_key_providers`, or a
//! `requests_per_minute` / `min_time_between_requests_ms` override) first takes a slot in
//! the connection's queue on its owner shard: queue-depth admission (429
//! `rate_limit_queue_full`), then a start now, at a spaced start, or FIFO behind others —
//! bounded by `max_wait_ms` (503 `rate_limit_queue_timeout`; the upstream never sees it). The
//! slot is returned exactly once by the guard's `Drop`. The execution budget is separate.

use std::time::Duration;

use crate::config::ConnectionId;
use crate::error::{ErrorKind, GatewayError};
use crate::flow::queue::QueueError;
use crate::runtime::msg::{Msg, SuccessAnswer};
use crate::shard::Shard;
use crate::flow::admission::queue_of;
use crate::shard::probe::Answer;

use super::ask::{Asked, ask_owner};

/// Held while an attempt runs; dropping it returns the queue slot.
pub struct QueueSlot<'a> {
    shard: &'a Shard,
    connection: ConnectionId,
    id: u64,
    /// The execution budget of the attempt (`execution_max_wait_ms`, at least the
    /// upstream's own response-head budget).
    pub execution_budget: Duration,
    /// A successful answer's rate-limit fields, sent with the slot's return.
    answered: Option<Box<SuccessAnswer>>,
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
        let headers = fields
            .filter(|(n, _)| {
                n.len() > RATE_LIMIT_PREFIX.len()
                    && n.as_bytes()[..RATE_LIMIT_PREFIX.len()]
                        .eq_ignore_ascii_case(RATE_LIMIT_PREFIX.as_bytes())
            })
            .map(|(n, v)| (n.to_owned(), String::from_utf8_lossy(v).into_owned()))
            .collect();
        self.answered = Some(Box::new(SuccessAnswer {
            status,
            headers,
        }));
    }
}

/// Header fields a queue learns from (`x-ratelimit-limit-requests`, `…-remaining…`,
/// `…-reset…`, `x-ratelimit-over-limit`).
const RATE_LIMIT_PREFIX: &str = "x-ratelimit-";

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        let owner = self.shard.owner(&self.connection);
        let msg = Msg::QueueFinish {
            connection: self.connection,
            id: self.id,
            answered: self.answered.take(),
        };
        if self.shard.send(owner, msg).is_err() {
            tracing::error!(
                connection = self.connection.0,
                "a queue slot could not be returned (mesh ring full)"
            );
        }
    }
}

pub fn error(e: QueueError) -> GatewayError {
    let kind = match e {
        QueueError::Full { .. } => ErrorKind::RateLimitQueueFull,
        QueueError::QueueTimeout { .. } => ErrorKind::RateLimitQueueTimeout,
        QueueError::ExecutionTimeout { .. } => ErrorKind::RateLimitExecutionTimeout,
        QueueError::Wedged => ErrorKind::RateLimitQueueWedged,
    };
    GatewayError::new(kind, e.message("this connection"))
}

/// Takes a slot in the connection's request queue. `Ok(None)`: its limiter is off.
pub async fn acquire<'a>(
    shard: &'a Shard,
    connection: ConnectionId,
    model: &str,
) -> Result<Option<QueueSlot<'a>>, GatewayError> {
    let Some((settings, _)) = queue_of(shard.config(), connection, model) else {
        return Ok(None);
    };
    // The owner times the queue wait out itself; this bound only guards a lost reply.
    let bound = if settings.max_wait_ms > 0 {
        Duration::from_millis(settings.max_wait_ms.saturating_add(1_000))
    } else {
        Duration::from_secs(24 * 3600)
    };
    let model = model.to_owned();
    let asked = ask_owner(
        shard,
        shard.owner(&connection),
        connection,
        &shard.queue_waiters,
        |id| Msg::QueueAcquire {
            id,
            connection,
            model,
        },
        |id| Msg::QueueCancel { connection, id },
        bound,
    )
    .await;
    let (id, answer) = match asked {
        Asked::Answered(id, a) => (id, a),
        Asked::Unsent => {
            return Err(GatewayError::new(
                ErrorKind::MeshUnavailable,
                "the connection's owner shard could not be asked for a queue slot",
            ));
        }
        Asked::TimedOut => {
            return Err(error(QueueError::QueueTimeout {
                max_wait_ms: settings.max_wait_ms,
            }));
        }
    };
    let start_at_ns = match answer {
        Answer::Queue(Ok(at)) => at,
        Answer::Queue(Err(e)) => return Err(error(e)),
        Answer::Probe(..) | Answer::Ack | Answer::Gate(_) => {
            return Err(GatewayError::new(
                ErrorKind::Internal,
                "unexpected answer to a queue request",
            ));
        }
    };
    let slot = QueueSlot {
        shard,
        connection,
        id,
        // The gateway has no separate per-provider start timeout to raise it to.
        execution_budget: Duration::from_millis(
            crate::flow::queue::execution_budget_ms(&settings, 0).max(1),
        ),
        answered: None,
    };
    // A spaced start: the slot is ours, its start is later.
    let now = shard.now().mono_ns;
    if start_at_ns > now {
        monoio::time::sleep(Duration::from_nanos(start_at_ns - now)).await;
    }
    Ok(Some(slot))
}
