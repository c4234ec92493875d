//! The session-affinity protocol: ask a session's owner which connection to use, tell it
//! to drop a pin. Only the session key's digest travels, never the key.

use crate::config::{ConnectionId, ProviderId};
use crate::mesh::placement::{DOMAIN_GLOBAL, OwnerKey, mix64};
use crate::routing::affinity::Eligible;
use crate::routing::session::SessionDigest;

/// A session, placed by its digest (its own domain, apart from ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session(pub SessionDigest);

impl OwnerKey for Session {
    fn owner_hash(&self) -> u64 {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        mix64(u64::from_le_bytes(first) ^ (DOMAIN_GLOBAL | 0x5e55))
    }
}

pub enum Request {
    /// Which of `eligible` (in the plan's order) session `session` uses for `provider`;
    /// pins live `ttl_ms` after their last use.
    Choose {
        provider: ProviderId,
        session: SessionDigest,
        eligible: Vec<Eligible>,
        ttl_ms: u64,
    },
    /// How many live pins this shard holds (`GET /api/monitoring/health`).
    Count,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The connection to try first, if any is eligible.
    Use(Option<ConnectionId>),
    /// Live pins, and the distinct sessions they pin.
    Count { pins: u32, sessions: u32 },
}

pub enum Fact {
    /// Delete the session's pin for `provider` if it points to `connection`.
    Drop {
        provider: ProviderId,
        session: SessionDigest,
        connection: ConnectionId,
    },
    /// A session owner made a new pin to `connection` at `at_ms` (monotonic): a use for
    /// every shard's least-recently-used pick.
    Used {
        connection: ConnectionId,
        at_ms: u64,
    },
}
