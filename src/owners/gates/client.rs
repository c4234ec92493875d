//! The asker's side of the gates (admit, concurrency): an attempt that needs any gate of
//! the composite gate (global → provider → account → model: `global_concurrent_requests`, `provider_concurrency`,
//! `max_concurrent`, `model_concurrency`) first takes all of them from the connection's gate
//! home (`flow::admission`) — all-or-nothing, FIFO, bounded by the queue budget — and gives
//! them back exactly once when the attempt ends, on every path (the guard's `Drop`).

use crate::config::Config;
use crate::config::ConnectionId;
use crate::error::{ErrorKind, GatewayError};
use crate::flow::admission::{combo_capacity, gate_home, gate_requirements};
use crate::flow::gates::{GateError, GateKey};
use crate::owners::{Req, Shard, admission, reply_bound};
use crate::shard::call::CallError;

use super::Gates;
use super::protocol::{Fact, Reply, Request};

/// Held while an attempt runs; dropping it releases the permits.
pub struct GatePermit<'a> {
    shard: &'a Shard,
    /// The shard holding the permits (the connection's gate home).
    home: usize,
    connection: ConnectionId,
    serial: u64,
}

impl GatePermit<'_> {
    /// Blocks the connection's gate on its home for `ms` (an upstream refusal with a retry
    /// hint). Sent on the same ring as this permit's release, so the block lands first.
    pub fn block_for(&self, model: &str, ms: u64) {
        let until_ns = self
            .shard
            .now()
            .mono_ns
            .saturating_add(ms.saturating_mul(1_000_000));
        let fact = Fact::Block {
            connection: self.connection,
            model: model.to_owned(),
            until_ns,
        };
        self.shard.send_fact(self.home, fact.into());
    }
}

impl Drop for GatePermit<'_> {
    fn drop(&mut self) {
        let fact = Fact::Release {
            serial: self.serial,
        };
        self.shard.send_fact(self.home, fact.into());
    }
}

/// Asks `connection`'s gate home for a grant (`request(deadline_ns)`), waiting until
/// `wait_ms` from now; the home times the wait out itself. A gate's `wait_ms = 0` is **no
/// wait** (B §2.1 rule 6: unlike the request queue's, a zero gate timeout is not "no
/// deadline"): the deadline is already due, so a contended request is refused with
/// `semaphore_timeout` at once and an uncontended one is granted.
async fn ask_home(
    shard: &Req<'_>,
    connection: ConnectionId,
    wait_ms: u64,
    request: impl FnOnce(Option<u64>) -> Request,
) -> (usize, Result<Reply, CallError>) {
    let deadline_ns = shard
        .now()
        .mono_ns
        .saturating_add(wait_ms.saturating_mul(1_000_000));
    let home = shard.owner(&gate_home(shard.config(), connection));
    // The home answers by the deadline; the bound only guards a lost reply.
    let bound = reply_bound(wait_ms.max(1));
    let reply = shard
        .call::<Gates>(home, request(Some(deadline_ns)), bound)
        .await;
    (home, reply)
}

/// Takes the connection's concurrency permits for `model`, waiting at most the queue
/// budget (`max_wait_ms`, per-connection override first; 0 = do not wait). `Ok(None)`: not
/// gated.
pub async fn acquire<'a>(
    shard: &Req<'a>,
    connection: ConnectionId,
    model: &str,
) -> Result<Option<GatePermit<'a>>, GatewayError> {
    let config = shard.config();
    // Scoped so that only the budget is kept across the wait below.
    let max_wait_ms = {
        let admission = admission(shard, connection);
        if !admission.gated(config, connection, model) {
            return Ok(None);
        }
        admission.limiter.max_wait_ms
    };
    let (home, reply) = ask_home(shard, connection, max_wait_ms, |deadline_ns| {
        Request::Acquire {
            connection,
            model: model.to_owned(),
            deadline_ns,
        }
    })
    .await;
    match reply {
        Ok(Reply::Granted(serial)) => Ok(Some(GatePermit {
            shard: shard.shard(),
            home,
            connection,
            serial,
        })),
        Ok(Reply::Denied(GateError::Timeout)) | Err(CallError::TimedOut) => {
            Err(timeout_error(config, connection, model, max_wait_ms))
        }
        Ok(Reply::Denied(GateError::QueueFull | GateError::DuplicateWaiter)) => {
            Err(GatewayError::new(
                ErrorKind::SemaphoreQueueFull,
                "a concurrency gate's queue is full",
            ))
        }
        Err(CallError::Unsent | CallError::Mismatched) => Err(GatewayError::new(
            ErrorKind::MeshUnavailable,
            "the connection's gate shard could not be asked for a permit",
        )),
    }
}

/// Takes `connection`'s quota-share slot (`qsconn:<connection>`, cap = its account capacity;
/// B §2.3) on its gate home for an attempt of quota-share combo `combo`. Fails open:
/// disabled, no cap, queue full (the combo's `queue_depth` waiting), a wait past its
/// `queue_timeout_ms` or an unreachable home all give `None`, and the attempt runs without
/// a slot.
pub async fn quota_share_slot<'a>(
    shard: &Req<'a>,
    combo: usize,
    connection: ConnectionId,
) -> Option<GatePermit<'a>> {
    let config = shard.config();
    if !config.resilience.quota_share_concurrency_limit.enabled
        || admission(shard, connection).account.is_none()
    {
        return None;
    }
    let combo = config.combos.get(combo)?;
    let (wait_ms, combo) = (combo.settings.queue_timeout_ms, combo.id);
    let (home, reply) = ask_home(shard, connection, wait_ms, |deadline_ns| Request::QsSlot {
        combo,
        connection,
        deadline_ns,
    })
    .await;
    match reply {
        Ok(Reply::Granted(serial)) => Some(GatePermit {
            shard: shard.shard(),
            home,
            connection,
            serial,
        }),
        _ => None,
    }
}

/// Takes round-robin combo `combo`'s semaphore for `model` on `connection` (B §2.2) on the
/// connection's gate home, waiting at most the combo's `queue_timeout_ms` behind at most
/// `queue_depth` others (0: never wait). `Err`: the semaphore is busy (timed out, queue
/// full, or the home could not be asked) — the combo skips the target.
pub async fn combo_slot<'a>(
    shard: &Req<'a>,
    combo: usize,
    connection: ConnectionId,
    model: &str,
) -> Result<GatePermit<'a>, GateError> {
    let Some(combo) = shard.config().combos.get(combo) else {
        return Err(GateError::QueueFull);
    };
    let (wait_ms, queue_depth, combo) = (
        combo.settings.queue_timeout_ms,
        combo.settings.queue_depth,
        combo.id,
    );
    let capacity = combo_capacity(shard.config(), combo, connection).unwrap_or(1);
    let (home, reply) = ask_home(shard, connection, wait_ms, |deadline_ns| {
        Request::ComboSlot {
            combo,
            connection,
            model: model.to_owned(),
            deadline_ns,
            capacity,
            queue_depth,
        }
    })
    .await;
    match reply {
        Ok(Reply::Granted(serial)) => Ok(GatePermit {
            shard: shard.shard(),
            home,
            connection,
            serial,
        }),
        Ok(Reply::Denied(e)) => Err(e),
        Err(_) => Err(GateError::Timeout),
    }
}

/// "Semaphore timeout after <ms>ms for <keys>" (B §2.1 rule 5), keys named as the spec
/// writes them: `global`, `provider:<p>`, `<p>:<connection>`, `<p>:<connection>:model:<m>`.
fn timeout_error(
    config: &Config,
    connection: ConnectionId,
    model: &str,
    max_wait_ms: u64,
) -> GatewayError {
    let conn = config.connection(connection);
    let provider = &config.provider(conn.provider).name;
    let keys: Vec<String> = gate_requirements(config, connection, model)
        .into_iter()
        .filter(|g| g.capacity.is_some())
        .map(|g| match g.key {
            GateKey::Global => "global".to_owned(),
            GateKey::Provider(_) => format!("provider:{provider}"),
            GateKey::Account(_) => format!("{provider}:{}", conn.name),
            GateKey::QuotaShare(_) => format!("qsconn:{}", conn.name),
            GateKey::Combo(..) => format!("combo:{provider}:{}", conn.name),
            GateKey::Model(_, m) => format!("{provider}:{}:model:{m}", conn.name),
        })
        .collect();
    GatewayError::new(
        ErrorKind::SemaphoreTimeout,
        format!(
            "Semaphore timeout after {max_wait_ms}ms for {}",
            keys.join(",")
        ),
    )
}

/// After a settings change (a PATCH): tells every shard's gate homes to apply the new
/// capacities to their live gates now. Each shard adopts the new settings before it
/// handles the fact, so a rise admits that gate's waiters without waiting for a release.
pub fn reconfigure_everywhere(shard: &Shard) {
    for to in 0..shard.shards() {
        shard.send_fact(to, Fact::Reconfigure.into());
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::Ordering::Relaxed;
    use std::task::Poll;
    use std::time::Duration;

    use super::*;

    use crate::owners::tests::shared_of as shared;

    /// Lets the shard's pump serve what was sent (the test's own task is not polled by it).
    async fn settle() {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }

    /// A request waits for a permit; the holder releases it and the gate home grants the
    /// waiter, but the waiting request is not being polled when the grant lands in its
    /// waiter (a request whose client hung up ends while it reads the client's socket) and
    /// is dropped without reading it. The permit goes back to the home: before, the cancel
    /// the drop sent found no waiter to remove and the permit stayed held for good (the
    /// flow_stress storm's lost `m1` permit).
    #[test]
    fn a_grant_that_lands_after_the_last_poll_of_a_dropped_wait_goes_back() {
        let toml = "[[providers]]\nid = \"up\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                    [[connections]]\nid = \"c\"\nprovider = \"up\"\nmax_concurrent = 1\n\
                    [connections.rate_limit_overrides]\nmax_wait_ms = 5000\n";
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        rt.block_on(async {
            let shard = crate::shard::Shard::new(0, shared(toml), None);
            shard.start(None);
            let gauges = || {
                let m = shard.metrics();
                (m.gate_permits.load(Relaxed), m.gate_waiters.load(Relaxed))
            };
            let req = Req::enter(&shard);
            let connection = ConnectionId(0);
            let first = acquire(&req, connection, "m").await;
            let first = first.ok().flatten().unwrap_or_else(|| panic!("no permit"));
            let mut second = Box::pin(acquire(&req, connection, "m"));
            // One poll sends the call; the home queues it behind the held permit.
            let ready = std::future::poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx).is_ready()));
            assert!(!ready.await, "the gate is full");
            settle().await;
            assert_eq!(gauges(), (1, 1), "one permit held, one waiter");
            // The release is served and the grant delivered to the second's waiter, which
            // is not polled again before it is dropped.
            drop(first);
            settle().await;
            assert_eq!(gauges(), (1, 0), "the waiter was granted");
            drop(second);
            settle().await;
            assert_eq!(gauges(), (0, 0), "the unread grant went back");
            // And the gate admits the next request at once.
            let third = acquire(&req, connection, "m").await;
            assert!(matches!(third, Ok(Some(_))));
        });
    }
}
