//! The asker's side of session affinity: the session of a request, the pin's owner asked
//! which connection to try first (the selection-time hook), and a pin dropped after a
//! failover (the post-attempt hook).

use std::time::Duration;

use crate::config::{ConnectionId, ProviderId};
use crate::http1::RequestHead;
use crate::owners::{Req, Shard};
use crate::routing::affinity::Eligible;
use crate::routing::session::{digest, session_key};

use super::Affinity;
pub use super::protocol::Session;
use super::protocol::{Fact, Reply, Request};

/// How long an asker waits for the pin's owner before keeping the plan's order (a lost
/// reply; the owner answers at once).
const CHOOSE_REPLY_TIMEOUT_MS: u64 = 1_000;

/// The session of a request when session affinity is on (`session_affinity_ttl_ms` > 0).
pub fn session_of(shard: &Req<'_>, head: &RequestHead, body: &[u8]) -> Option<Session> {
    if shard.config().resilience.session_affinity_ttl_ms == 0 {
        return None;
    }
    let key = session_key(|name| head.header(name), body)?;
    Some(Session(digest(&key)))
}

/// Which of `eligible` (the connections of `provider` that may be routed to now, in the
/// plan's order) the session uses: its pin, or a fresh pick now pinned. `None` when none is
/// eligible or the owner did not answer (the plan's order stands).
pub async fn choose(
    shard: &Req<'_>,
    session: Session,
    provider: ProviderId,
    eligible: Vec<Eligible>,
) -> Option<ConnectionId> {
    let request = Request::Choose {
        provider,
        session: session.0,
        eligible,
        ttl_ms: shard.config().resilience.session_affinity_ttl_ms,
    };
    let bound = Duration::from_millis(CHOOSE_REPLY_TIMEOUT_MS);
    let owner = shard.owner(&session);
    match shard.call::<Affinity>(owner, request, bound).await.ok()? {
        Reply::Use(pinned) => pinned,
        Reply::Count { .. } => None,
    }
}

/// Live pins and the sessions they pin, summed over every shard's owner (`None`: an owner
/// did not answer).
pub async fn count_all(shard: &Shard) -> Option<Vec<(u32, u32)>> {
    let bound = Duration::from_millis(CHOOSE_REPLY_TIMEOUT_MS);
    let mut out = Vec::with_capacity(shard.shards());
    for owner in 0..shard.shards() {
        match shard
            .call::<Affinity>(owner, Request::Count, bound)
            .await
            .ok()?
        {
            Reply::Count { pins, sessions } => out.push((pins, sessions)),
            Reply::Use(_) => return None,
        }
    }
    Some(out)
}

/// The pinned connection failed and the request moved on (after a 429): forget the pin.
pub fn drop_pin(shard: &Shard, session: Session, provider: ProviderId, connection: ConnectionId) {
    let fact = Fact::Drop {
        provider,
        session: session.0,
        connection,
    };
    shard.send_fact(shard.owner(&session), fact.into());
}
