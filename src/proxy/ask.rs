//! Asking the shard that holds a connection's grants (its owner for queue slots, its gate
//! home for permits) for one and waiting, bounded, for the answer. The waiter id is unique
//! across shards; the waiter's connection is remembered so that a grant arriving after the
//! asker gave up is handed back (to the shard that sent it).

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use crate::config::ConnectionId;
use crate::runtime::msg::Msg;
use crate::shard::probe::Answer;
use crate::shard::{Shard, global_waiter_id};

/// How long an asker waits for the answer to a request whose owner times the wait out
/// itself after `wait_ms` (0 = no deadline): that, plus a second for the reply. The bound
/// only guards a lost reply.
pub fn reply_bound(wait_ms: u64) -> Duration {
    if wait_ms > 0 {
        Duration::from_millis(wait_ms.saturating_add(1_000))
    } else {
        Duration::from_secs(24 * 3600)
    }
}

/// How asking went.
pub enum Asked {
    /// The owner's answer to waiter `id`.
    Answered(u64, Answer),
    /// The request could not be sent (mesh ring full).
    Unsent,
    /// No answer within the bound; the owner was told to cancel the waiter.
    TimedOut,
}

/// Sends `request(id)` to shard `owner` and waits at most `bound`; on timeout sends
/// `cancel(id)`. `waiters` is the shard's table of outstanding waiters of this kind.
pub async fn ask_owner<C: FnOnce(u64) -> Msg>(
    shard: &Shard,
    owner: usize,
    connection: ConnectionId,
    waiters: &RefCell<HashMap<u64, ConnectionId>>,
    request: impl FnOnce(u64) -> Msg,
    cancel: C,
    bound: Duration,
) -> Asked {
    let (local, wait) = shard.probes.register();
    let id = global_waiter_id(shard.id, local);
    waiters.borrow_mut().insert(local, connection);
    if !shard.send_reliable(owner, request(id)) {
        shard.probes.forget(local);
        waiters.borrow_mut().remove(&local);
        return Asked::Unsent;
    }
    // From here, giving up — on timeout, or because the asker's future is dropped (its
    // client hung up) — cancels the waiter on the owner.
    let mut outstanding = Outstanding {
        shard,
        owner,
        local,
        id,
        cancel: Some(cancel),
    };
    match monoio::time::timeout(bound, wait).await {
        Ok(answer) => {
            outstanding.cancel = None;
            waiters.borrow_mut().remove(&local);
            Asked::Answered(id, answer)
        }
        Err(_) => Asked::TimedOut,
    }
}

/// A request sent and not yet answered. Dropped unanswered, it forgets the local waiter and
/// tells the owner to cancel; the waiter's entry in the shard's table stays, so a grant
/// racing the cancel is handed back by the pump.
struct Outstanding<'s, C: FnOnce(u64) -> Msg> {
    shard: &'s Shard,
    owner: usize,
    local: u64,
    id: u64,
    cancel: Option<C>,
}

impl<C: FnOnce(u64) -> Msg> Drop for Outstanding<'_, C> {
    fn drop(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            self.shard.probes.forget(self.local);
            self.shard.send_reliable(self.owner, cancel(self.id));
        }
    }
}
