//! The lease protocol: every lease action is a call to the lease-owner shard. Only the
//! owner token's digest travels, never the token.

use crate::config::ConnectionId;
use crate::routing::lease::{AcquireRefused, Fence, LeaseInfo, OwnerHash};

/// The shard that holds every lease (ARCHITECTURE §3).
pub const LEASE_OWNER_SHARD: usize = 0;

/// A lease action of `owner` through client key `key` (its configured id).
pub struct Request {
    pub owner: OwnerHash,
    pub key: String,
    pub action: Action,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Acquire on the first free of `eligible` (in preference order), for `ttl_ms`;
    /// `candidates` are every connection the acquire could use, routable now or not (an
    /// owner's lease on one that is not eligible moves: `LeaseTable::acquire`).
    Acquire {
        candidates: Vec<ConnectionId>,
        eligible: Vec<ConnectionId>,
        ttl_ms: u64,
    },
    Renew {
        generation: u64,
        ttl_ms: u64,
    },
    Release {
        generation: u64,
    },
    Status {
        generation: u64,
    },
    /// The fence of an inference request (B §5.4).
    Fence {
        generation: u64,
    },
    /// How many leases are active (`GET /api/monitoring/health`).
    Count,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Acquired, reused, renewed, released or reported.
    Lease(LeaseInfo),
    Refused(AcquireRefused),
    /// Renew, release or status of a lease the owner does not hold under that key and
    /// generation.
    Stale,
    Fence(Fence),
    Count(u32),
}

/// No lease facts: every action is a call.
pub enum Fact {}
