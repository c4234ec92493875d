//! The asker's side of leases: an owner token's digest, and a lease action sent to the
//! lease-owner shard. An unanswered call is a typed 503, never a silent pass.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::{ErrorKind, GatewayError, LeaseCode};
use crate::owners::Shard;
use crate::routing::lease::OwnerHash;

use super::Leases;
use super::protocol::{Action, LEASE_OWNER_SHARD, Reply, Request};

/// How long an asker waits for the lease owner (it answers at once; this guards a lost
/// reply or a stalled shard 0).
const LEASE_REPLY_TIMEOUT_MS: u64 = 2_000;

/// The digest an owner token is known by (only this is stored or sent).
pub fn owner_hash(token: &str) -> OwnerHash {
    Sha256::digest(token.as_bytes()).into()
}

/// Sends `action` of `owner` through client key `key` to the lease owner.
pub async fn act(
    shard: &Shard,
    owner: OwnerHash,
    key: &str,
    action: Action,
) -> Result<Reply, GatewayError> {
    let request = Request {
        owner,
        key: key.to_owned(),
        action,
    };
    let bound = Duration::from_millis(LEASE_REPLY_TIMEOUT_MS);
    shard
        .call::<Leases>(LEASE_OWNER_SHARD, request, bound)
        .await
        .map_err(|e| {
            GatewayError::new(
                ErrorKind::Lease(LeaseCode::ServiceUnavailable),
                format!("the lease service did not answer ({e:?})"),
            )
        })
}

/// Active leases (`None`: the lease owner did not answer).
pub async fn count(shard: &Shard) -> Option<u32> {
    match act(shard, [0; 32], "", Action::Count).await.ok()? {
        Reply::Count(n) => Some(n),
        Reply::Lease(_) | Reply::Refused(_) | Reply::Stale | Reply::Fence(_) => None,
    }
}
