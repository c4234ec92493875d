//! The lease owner (shard 0): the lease table, and its answers to lease actions.

use crate::config::{Config, ConnectionId, Scope};
use crate::routing::lease::{LeaseTable, OwnerHash, PersistedLease};
use crate::shard::call::CallId;
use crate::snapshot::state::Records;

use super::protocol::{Action, Fact, LEASE_OWNER_SHARD, Reply, Request};
use crate::owners::{Cx, Mechanism, Shard};

/// Every lease (only shard 0's table is ever used).
#[derive(Debug, Default)]
pub struct Leases {
    pub table: LeaseTable,
}

impl Leases {
    /// Ends the leases whose connection the configuration no longer has or has disabled, or
    /// whose key is gone, lost its `lease:exclusive` scope or may no longer use the
    /// connection.
    fn invalidate_unauthorised(&mut self, cx: &Cx<'_>) {
        self.table.invalidate(cx.now, |connection, key| {
            authorised(cx.config, connection, key)
        });
    }
}

/// Whether `config` still lets `key` hold a lease on `connection`: the connection exists
/// and is enabled, and the key exists, with `lease:exclusive` and the connection in its
/// `allowed_connections`.
fn authorised(config: &Config, connection: ConnectionId, key: &str) -> bool {
    config
        .connection_by_id(connection)
        .is_some_and(|c| c.enabled)
        && config.client_keys.iter().any(|k| {
            k.id == key
                && k.has_scope(Scope::LeaseExclusive)
                && k.allowed_connections
                    .as_ref()
                    .is_some_and(|a| a.contains(&connection))
        })
}

/// Collects up to `max` changed leases for the snapshot writer (only the lease owner has
/// any).
pub fn snapshot_delta(shard: &Shard, max: usize) -> Vec<(OwnerHash, Option<PersistedLease>)> {
    let now = shard.now();
    shard
        .state()
        .owners
        .leases
        .borrow_mut()
        .table
        .take_changed(now, max)
}

/// Start-up: the lease owner takes back the persisted leases (whatever the shard count:
/// they all live on shard 0), ending those the configuration no longer authorises.
pub fn restore(shard: &Shard, records: &Records) {
    if records.leases.is_empty() || shard.id() != LEASE_OWNER_SHARD {
        return;
    }
    let now = shard.now();
    let mut leases = shard.state().owners.leases.borrow_mut();
    for (owner, lease) in &records.leases {
        leases.table.adopt(*owner, lease, now);
    }
    // A restart with a changed file is a reload: a lease the file no longer authorises
    // ends now, not at the first housekeeping round (until then it held its connection).
    let current = shard.current();
    let config = current.config();
    leases
        .table
        .invalidate(now, |connection, key| authorised(config, connection, key));
}

impl Mechanism for Leases {
    type Fact = Fact;
    type Request = Request;
    type Reply = Reply;
    const HOLDS: bool = false;

    fn new(_config: &Config) -> Self {
        Self::default()
    }

    fn call(&mut self, cx: &mut Cx<'_>, id: CallId, request: Request) {
        let Request { owner, key, action } = request;
        let now = cx.now;
        let t = &mut self.table;
        let or_stale = |r: Option<_>| r.map_or(Reply::Stale, Reply::Lease);
        let reply = match action {
            Action::Acquire {
                candidates,
                eligible,
                ttl_ms,
            } => match t.acquire(owner, &key, &candidates, &eligible, ttl_ms, now) {
                Ok(info) => Reply::Lease(info),
                Err(refused) => Reply::Refused(refused),
            },
            Action::Renew { generation, ttl_ms } => {
                or_stale(t.renew(&owner, &key, generation, ttl_ms, now))
            }
            Action::Release { generation } => or_stale(t.release(&owner, &key, generation, now)),
            Action::Status { generation } => or_stale(t.status(&owner, &key, generation, now)),
            Action::Fence { generation } => Reply::Fence(t.fence(&owner, &key, generation, now)),
            Action::Count => Reply::Count(u32::try_from(t.active(now)).unwrap_or(u32::MAX)),
        };
        cx.reply(id, reply);
    }

    fn fact(&mut self, _cx: &mut Cx<'_>, fact: Fact) {
        match fact {}
    }

    fn housekeeping(&mut self, cx: &mut Cx<'_>) {
        self.table.sweep(cx.now);
        self.invalidate_unauthorised(cx);
    }

    fn settings_changed(&mut self, cx: &mut Cx<'_>) {
        self.invalidate_unauthorised(cx);
    }
}
