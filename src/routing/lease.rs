//! Exclusive session leases (spec B §5): which owner holds which connection, under which
//! generation and client key, until when. A pure table over an injected clock; one
//! lease-owner shard holds it (`owners::leases`), since a lease is unique over two keys at
//! once — one active lease per connection and one per owner.
//!
//! An owner is known only by the SHA-256 digest of its `vlo_…` token ([`OwnerHash`]); the
//! token itself never reaches the table. Each owner keeps its latest lease (whatever its
//! state): that lease's generation is the highest the owner ever had, so a new lease gets
//! the next one. Expiry is lazy: a lease whose end has passed counts as EXPIRED from that
//! instant, whether or not a sweep has marked it yet.

use std::collections::{BTreeSet, HashMap};

use crate::clock::Now;
use crate::config::ConnectionId;
use crate::config::{MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS};

/// SHA-256 of an owner token.
pub type OwnerHash = [u8; 32];

/// How long an owner's ended lease is kept (its generation with it) before the sweep
/// forgets the owner: a day. An owner that comes back later starts at generation 1 again.
pub const ENDED_LEASE_KEPT_MS: u64 = 24 * 3_600_000;
/// At most this many owners are remembered (each with its latest lease). Active leases are
/// at most one per connection; the rest are ended leases kept for their generation, which a
/// client cycling fresh owner tokens could otherwise grow without bound for a day.
pub const MAX_LEASE_OWNERS: usize = 100_000;
/// The longest `Retry-After` of a capacity answer (B §5.2), and of an eligibility refusal.
pub const MAX_RETRY_AFTER_S: u64 = 3_600;

/// A lease's state (B §5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    Active,
    Released,
    Expired,
    /// Its connection left the configuration, or its key no longer may use it.
    Invalidated,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Active => "ACTIVE",
            LeaseState::Released => "RELEASED",
            LeaseState::Expired => "EXPIRED",
            LeaseState::Invalidated => "INVALIDATED",
        }
    }

    /// The state [`LeaseState::as_str`] names (`None`: another word).
    pub fn parse(s: &str) -> Option<LeaseState> {
        [
            LeaseState::Active,
            LeaseState::Released,
            LeaseState::Expired,
            LeaseState::Invalidated,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}

/// One owner's latest lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub connection: ConnectionId,
    /// The client key id it was acquired with.
    pub key: String,
    pub generation: u64,
    state: LeaseState,
    pub acquired_wall_ms: u64,
    pub renewed_wall_ms: u64,
    pub expires_wall_ms: u64,
    expires_mono_ms: u64,
    /// When it stopped being active (monotonic ms), for the sweep.
    ended_mono_ms: u64,
}

impl Lease {
    /// Its state at `now` (an active lease past its end is expired).
    pub fn state(&self, now: Now) -> LeaseState {
        if self.state == LeaseState::Active && self.expires_mono_ms <= now.mono_ms() {
            LeaseState::Expired
        } else {
            self.state
        }
    }
}

/// What an answered lease action reports (B §5.2: never the connection, key or owner).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    pub state: LeaseState,
    pub generation: u64,
    pub acquired_wall_ms: u64,
    pub renewed_wall_ms: u64,
    pub expires_wall_ms: u64,
    /// The lease's connection (for `status`, and the owner's own use; never shown).
    pub connection: ConnectionId,
}

impl From<&Lease> for LeaseInfo {
    fn from(l: &Lease) -> Self {
        LeaseInfo {
            state: l.state,
            generation: l.generation,
            acquired_wall_ms: l.acquired_wall_ms,
            renewed_wall_ms: l.renewed_wall_ms,
            expires_wall_ms: l.expires_wall_ms,
            connection: l.connection,
        }
    }
}

/// Why an acquire was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireRefused {
    /// The owner's lease is active under another key, or on a connection this acquire may
    /// not use: nothing is rebound.
    OwnerActive,
    /// Every eligible connection is leased by another owner.
    Capacity {
        eligible: u32,
        free: u32,
        retry_after_s: u64,
    },
}

/// An inference request's fence check (B §5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// Dispatch only to this connection.
    Valid(ConnectionId),
    /// The owner has no lease at all.
    Required,
    /// The owner's lease has another generation, or is no longer active.
    Stale,
    /// The lease was acquired with another client key.
    AuthorizationMismatch,
}

/// An owner's latest lease as the snapshot keeps it: instants in wall-clock ms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedLease {
    pub connection: ConnectionId,
    pub key: String,
    pub generation: u64,
    pub state: LeaseState,
    pub acquired_wall_ms: u64,
    pub renewed_wall_ms: u64,
    pub expires_wall_ms: u64,
    /// When it stopped being active (0 while active).
    pub ended_wall_ms: u64,
}

/// The leases, by owner and by connection.
#[derive(Debug, Default)]
pub struct LeaseTable {
    by_owner: HashMap<OwnerHash, Lease>,
    /// The owner of each connection's active lease (possibly past its end: checked lazily).
    by_connection: HashMap<ConnectionId, OwnerHash>,
    /// Owners whose lease changed since the snapshot last collected them.
    dirty: BTreeSet<OwnerHash>,
}

impl LeaseTable {
    /// Marks every lease past its end as expired.
    fn reconcile(&mut self, now: Now) {
        let now_ms = now.mono_ms();
        let by_owner = &mut self.by_owner;
        self.by_connection
            .retain(|_, owner| match by_owner.get_mut(owner) {
                Some(l) if l.state(now) == LeaseState::Active => true,
                Some(l) => {
                    if l.state == LeaseState::Active {
                        l.state = LeaseState::Expired;
                        l.ended_mono_ms = l.expires_mono_ms.min(now_ms);
                    }
                    false
                }
                None => false,
            });
    }

    /// Acquires a lease for `owner` through `key` on the first of `eligible` (in
    /// preference order) no other owner holds. `candidates` are the connections the
    /// acquire could use at all (the key's connections that serve its model, whatever
    /// their health); `eligible` are those of them routable now (B §5.2).
    ///
    /// The owner's active lease through the same key: on an eligible connection it is
    /// reused (same generation, end pushed out by `ttl_ms`); on a candidate that is no
    /// longer eligible (cooling, terminal, breaker open) it moves to the first free
    /// eligible one with the next generation (B §5.3) — or stays where it is when none is
    /// free. Through another key, or on a connection that is no candidate: refused,
    /// untouched.
    pub fn acquire(
        &mut self,
        owner: OwnerHash,
        key: &str,
        candidates: &[ConnectionId],
        eligible: &[ConnectionId],
        ttl_ms: u64,
        now: Now,
    ) -> Result<LeaseInfo, AcquireRefused> {
        self.reconcile(now);
        let ttl_ms = ttl_ms.clamp(MIN_LEASE_TTL_MS, MAX_LEASE_TTL_MS);
        let mut next_generation = 1;
        let mut moving_from = None;
        if let Some(l) = self.by_owner.get_mut(&owner) {
            if l.state == LeaseState::Active {
                if l.key != key || !candidates.contains(&l.connection) {
                    return Err(AcquireRefused::OwnerActive);
                }
                if eligible.contains(&l.connection) {
                    extend(l, ttl_ms, now);
                    self.dirty.insert(owner);
                    return Ok(LeaseInfo::from(&*l));
                }
                moving_from = Some(l.connection);
            }
            next_generation = l.generation.saturating_add(1);
        }
        let busy = |c: &ConnectionId| self.by_connection.contains_key(c);
        let Some(&connection) = eligible.iter().find(|c| !busy(c)) else {
            return Err(self.capacity(eligible, now));
        };
        if let Some(from) = moving_from {
            // The transition: the old binding ends here, the new generation starts.
            self.by_connection.remove(&from);
        }
        let lease = Lease {
            connection,
            key: key.to_owned(),
            generation: next_generation,
            state: LeaseState::Active,
            acquired_wall_ms: now.wall_ms,
            renewed_wall_ms: now.wall_ms,
            expires_wall_ms: now.wall_ms.saturating_add(ttl_ms),
            expires_mono_ms: now.mono_ms().saturating_add(ttl_ms),
            ended_mono_ms: 0,
        };
        let info = LeaseInfo::from(&lease);
        if !self.by_owner.contains_key(&owner) {
            self.make_room();
        }
        self.by_owner.insert(owner, lease);
        self.by_connection.insert(connection, owner);
        self.dirty.insert(owner);
        Ok(info)
    }

    /// The refusal when every one of `eligible` is leased by another owner: retry when
    /// the earliest of those leases ends.
    fn capacity(&self, eligible: &[ConnectionId], now: Now) -> AcquireRefused {
        let ends = eligible
            .iter()
            .filter_map(|c| self.by_connection.get(c))
            .filter_map(|o| self.by_owner.get(o))
            .map(|l| l.expires_mono_ms)
            .min();
        let retry_after_s = match ends {
            Some(end) => end
                .saturating_sub(now.mono_ms())
                .div_ceil(1_000)
                .clamp(1, MAX_RETRY_AFTER_S),
            None => 1,
        };
        AcquireRefused::Capacity {
            eligible: u32::try_from(eligible.len()).unwrap_or(u32::MAX),
            free: 0,
            retry_after_s,
        }
    }

    /// The owner's active lease of exactly `generation` acquired through `key`.
    fn active_mut(
        &mut self,
        owner: &OwnerHash,
        key: &str,
        generation: u64,
        now: Now,
    ) -> Option<&mut Lease> {
        self.reconcile(now);
        self.by_owner
            .get_mut(owner)
            .filter(|l| l.state == LeaseState::Active && l.generation == generation && l.key == key)
    }

    /// Renews the owner's active lease of `generation`: end = now + TTL. `None`: stale.
    pub fn renew(
        &mut self,
        owner: &OwnerHash,
        key: &str,
        generation: u64,
        ttl_ms: u64,
        now: Now,
    ) -> Option<LeaseInfo> {
        let ttl_ms = ttl_ms.clamp(MIN_LEASE_TTL_MS, MAX_LEASE_TTL_MS);
        let l = self.active_mut(owner, key, generation, now)?;
        extend(l, ttl_ms, now);
        let info = LeaseInfo::from(&*l);
        self.dirty.insert(*owner);
        Some(info)
    }

    /// Releases the owner's active lease of `generation`; a repeat by the same key and
    /// generation of a released lease answers again. `None`: stale.
    pub fn release(
        &mut self,
        owner: &OwnerHash,
        key: &str,
        generation: u64,
        now: Now,
    ) -> Option<LeaseInfo> {
        if let Some(l) = self.active_mut(owner, key, generation, now) {
            l.state = LeaseState::Released;
            l.ended_mono_ms = now.mono_ms();
            let connection = l.connection;
            let info = LeaseInfo::from(&*l);
            self.by_connection.remove(&connection);
            self.dirty.insert(*owner);
            return Some(info);
        }
        self.by_owner
            .get(owner)
            .filter(|l| {
                l.state == LeaseState::Released && l.generation == generation && l.key == key
            })
            .map(LeaseInfo::from)
    }

    /// The owner's active lease of `generation` through `key`. `None`: stale.
    pub fn status(
        &mut self,
        owner: &OwnerHash,
        key: &str,
        generation: u64,
        now: Now,
    ) -> Option<LeaseInfo> {
        self.active_mut(owner, key, generation, now)
            .map(|l| LeaseInfo::from(&*l))
    }

    /// The fence of an inference request by `owner` with `generation` through `key`.
    pub fn fence(&mut self, owner: &OwnerHash, key: &str, generation: u64, now: Now) -> Fence {
        self.reconcile(now);
        match self.by_owner.get(owner) {
            None => Fence::Required,
            Some(l) if l.key != key => Fence::AuthorizationMismatch,
            Some(l) if l.state == LeaseState::Active && l.generation == generation => {
                Fence::Valid(l.connection)
            }
            Some(_) => Fence::Stale,
        }
    }

    /// Invalidates active leases whose connection `keep` refuses (removed from the
    /// configuration, or no longer allowed for the lease's key).
    pub fn invalidate(&mut self, now: Now, keep: impl Fn(ConnectionId, &str) -> bool) {
        self.reconcile(now);
        let by_owner = &mut self.by_owner;
        self.by_connection
            .retain(|c, owner| match by_owner.get_mut(owner) {
                Some(l) if !keep(*c, &l.key) => {
                    l.state = LeaseState::Invalidated;
                    l.ended_mono_ms = now.mono_ms();
                    false
                }
                Some(_) => true,
                None => false,
            });
    }

    /// Before a new owner is added: when [`MAX_LEASE_OWNERS`] are remembered, forgets the
    /// owners whose lease ended longest ago — a sixteenth of the table at once, so the scan
    /// is paid once per many new owners. Active leases (at most one per connection) are
    /// never forgotten. Call after `reconcile`, so an expired lease counts as ended.
    fn make_room(&mut self) {
        if self.by_owner.len() < MAX_LEASE_OWNERS {
            return;
        }
        let mut ended: Vec<(u64, OwnerHash)> = self
            .by_owner
            .iter()
            .filter(|(_, l)| l.state != LeaseState::Active)
            .map(|(o, l)| (l.ended_mono_ms, *o))
            .collect();
        let excess = self.by_owner.len() + 1 - MAX_LEASE_OWNERS;
        let k = excess.max(MAX_LEASE_OWNERS / 16).min(ended.len());
        if k == 0 {
            return;
        }
        if k < ended.len() {
            ended.select_nth_unstable(k - 1);
        }
        for (_, owner) in ended.iter().take(k) {
            self.by_owner.remove(owner);
            self.dirty.insert(*owner);
        }
    }

    /// Marks expired leases and forgets owners whose lease ended more than
    /// [`ENDED_LEASE_KEPT_MS`] ago.
    pub fn sweep(&mut self, now: Now) {
        self.reconcile(now);
        let now_ms = now.mono_ms();
        let dirty = &mut self.dirty;
        self.by_owner.retain(|owner, l| {
            let keep = l.state == LeaseState::Active
                || now_ms.saturating_sub(l.ended_mono_ms) < ENDED_LEASE_KEPT_MS;
            if !keep {
                dirty.insert(*owner);
            }
            keep
        });
    }

    /// Up to `max` owners whose lease changed since the last call, each with its lease as
    /// the snapshot keeps it (`None`: forgotten).
    pub fn take_changed(
        &mut self,
        now: Now,
        max: usize,
    ) -> Vec<(OwnerHash, Option<PersistedLease>)> {
        self.reconcile(now);
        let now_ms = now.mono_ms();
        let wall = |mono_ms: u64| now.wall_ms.saturating_sub(now_ms.saturating_sub(mono_ms));
        let mut out = Vec::new();
        while out.len() < max {
            let Some(owner) = self.dirty.pop_first() else {
                break;
            };
            let record = self.by_owner.get(&owner).map(|l| PersistedLease {
                connection: l.connection,
                key: l.key.clone(),
                generation: l.generation,
                state: l.state,
                acquired_wall_ms: l.acquired_wall_ms,
                renewed_wall_ms: l.renewed_wall_ms,
                expires_wall_ms: l.expires_wall_ms,
                ended_wall_ms: if l.state == LeaseState::Active {
                    0
                } else {
                    wall(l.ended_mono_ms)
                },
            });
            out.push((owner, record));
        }
        out
    }

    /// Takes back a persisted lease (start-up). An active lease already past its end comes
    /// back expired; one whose connection another restored lease holds is invalidated.
    pub fn adopt(&mut self, owner: OwnerHash, p: &PersistedLease, now: Now) {
        let now_ms = now.mono_ms();
        let mono = |wall_ms: u64| {
            if wall_ms >= now.wall_ms {
                now_ms.saturating_add(wall_ms - now.wall_ms)
            } else {
                now_ms.saturating_sub(now.wall_ms - wall_ms)
            }
        };
        let mut state = p.state;
        if state == LeaseState::Active && self.by_connection.contains_key(&p.connection) {
            state = LeaseState::Invalidated;
        }
        let lease = Lease {
            connection: p.connection,
            key: p.key.clone(),
            generation: p.generation,
            state,
            acquired_wall_ms: p.acquired_wall_ms,
            renewed_wall_ms: p.renewed_wall_ms,
            expires_wall_ms: p.expires_wall_ms,
            expires_mono_ms: mono(p.expires_wall_ms),
            ended_mono_ms: if state == LeaseState::Active {
                0
            } else if p.ended_wall_ms > 0 {
                mono(p.ended_wall_ms)
            } else {
                now_ms
            },
        };
        if !self.by_owner.contains_key(&owner) {
            self.make_room();
        }
        if state == LeaseState::Active {
            self.by_connection.insert(p.connection, owner);
        }
        self.by_owner.insert(owner, lease);
        // Re-reported, so the writer's copy follows this table from now on.
        self.dirty.insert(owner);
        self.reconcile(now);
    }

    /// Active leases at `now`.
    pub fn active(&self, now: Now) -> usize {
        self.by_connection
            .values()
            .filter_map(|o| self.by_owner.get(o))
            .filter(|l| l.state(now) == LeaseState::Active)
            .count()
    }

    /// The owner's latest lease, whatever its state (tests).
    #[cfg(test)]
    fn get(&self, owner: &OwnerHash) -> Option<&Lease> {
        self.by_owner.get(owner)
    }
}

fn extend(l: &mut Lease, ttl_ms: u64, now: Now) {
    l.renewed_wall_ms = now.wall_ms;
    l.expires_wall_ms = now.wall_ms.saturating_add(ttl_ms);
    l.expires_mono_ms = now.mono_ms().saturating_add(ttl_ms);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    const A: OwnerHash = [1; 32];
    const B: OwnerHash = [2; 32];
    const C0: ConnectionId = ConnectionId(0);
    const C1: ConnectionId = ConnectionId(1);

    fn clock() -> ManualClock {
        let c = ManualClock::new(1_700_000_000_000);
        c.advance_ms(5_000);
        c
    }

    #[test]
    fn a_first_lease_is_generation_one_and_a_reacquire_after_release_is_two() {
        let clock = clock();
        let mut t = LeaseTable::default();
        let got = t.acquire(A, "k", &[C0], &[C0], 10_000, clock.now());
        assert_eq!(got.map(|i| (i.generation, i.connection)), Ok((1, C0)));
        assert_eq!(t.active(clock.now()), 1);
        let released = t.release(&A, "k", 1, clock.now());
        assert_eq!(released.map(|i| i.state), Some(LeaseState::Released));
        // Idempotent repeat by the same key and generation.
        assert!(t.release(&A, "k", 1, clock.now()).is_some());
        // Not by another key, nor another generation.
        assert!(t.release(&A, "other", 1, clock.now()).is_none());
        assert!(t.release(&A, "k", 2, clock.now()).is_none());
        assert_eq!(t.active(clock.now()), 0);
        let again = t.acquire(A, "k", &[C0], &[C0], 10_000, clock.now());
        assert_eq!(again.map(|i| i.generation), Ok(2));
    }

    #[test]
    fn the_same_owner_and_key_reuse_an_active_lease_and_push_out_its_end() {
        let clock = clock();
        let mut t = LeaseTable::default();
        let first = t.acquire(A, "k", &[C0, C1], &[C0, C1], 10_000, clock.now());
        clock.advance_ms(4_000);
        let again = t.acquire(A, "k", &[C1, C0], &[C1, C0], 10_000, clock.now());
        let (Ok(first), Ok(again)) = (first, again) else {
            panic!("both granted");
        };
        assert_eq!((again.generation, again.connection), (1, C0));
        assert_eq!(again.expires_wall_ms, first.expires_wall_ms + 4_000);
        assert_eq!(again.acquired_wall_ms, first.acquired_wall_ms);
        // Through another key, or where its connection is not eligible: refused, untouched.
        let other_key = t.acquire(A, "k2", &[C0], &[C0], 10_000, clock.now());
        assert_eq!(other_key, Err(AcquireRefused::OwnerActive));
        let elsewhere = t.acquire(A, "k", &[C1], &[C1], 10_000, clock.now());
        assert_eq!(elsewhere, Err(AcquireRefused::OwnerActive));
        assert_eq!(t.get(&A).map(|l| l.connection), Some(C0));
    }

    #[test]
    fn a_lease_whose_connection_is_no_longer_eligible_moves_with_the_next_generation() {
        const C2: ConnectionId = ConnectionId(2);
        let clock = clock();
        let mut t = LeaseTable::default();
        let both = [C0, C1, C2];
        assert!(t.acquire(A, "k", &both, &both, 10_000, clock.now()).is_ok());
        assert!(t.acquire(B, "k", &[C1], &[C1], 10_000, clock.now()).is_ok());
        clock.advance_ms(3_000);
        // C0 cools: A's next acquire moves it past B's C1 to C2, generation 2, a fresh
        // lease (acquired now, a full TTL).
        let moved = t.acquire(A, "k", &both, &[C1, C2], 10_000, clock.now());
        let Ok(moved) = moved else {
            panic!("moved: {moved:?}");
        };
        assert_eq!((moved.connection, moved.generation), (C2, 2));
        assert_eq!(moved.acquired_wall_ms, clock.now().wall_ms);
        assert_eq!(moved.expires_wall_ms, clock.now().wall_ms + 10_000);
        assert_eq!(t.fence(&A, "k", 1, clock.now()), Fence::Stale);
        assert_eq!(t.fence(&A, "k", 2, clock.now()), Fence::Valid(C2));
        assert_eq!(t.active(clock.now()), 2);
        // C0 is free again for another owner.
        let c = t.acquire([3; 32], "k", &[C0], &[C0], 10_000, clock.now());
        assert_eq!(c.map(|i| (i.connection, i.generation)), Ok((C0, 1)));
        // Every eligible one held by another owner: refused, and A's lease stays on C2.
        let held = t.acquire(A, "k", &both, &[C0, C1], 10_000, clock.now());
        assert!(
            matches!(held, Err(AcquireRefused::Capacity { eligible: 2, .. })),
            "{held:?}"
        );
        assert_eq!(t.fence(&A, "k", 2, clock.now()), Fence::Valid(C2));
        // Another key never moves it, eligible or not.
        let other = t.acquire(A, "k2", &both, &[C0], 10_000, clock.now());
        assert_eq!(other, Err(AcquireRefused::OwnerActive));
        assert_eq!(t.fence(&A, "k", 2, clock.now()), Fence::Valid(C2));
    }

    #[test]
    fn a_second_owner_gets_a_free_connection_or_a_capacity_refusal() {
        let clock = clock();
        let mut t = LeaseTable::default();
        assert!(t.acquire(A, "k", &[C0], &[C0], 30_000, clock.now()).is_ok());
        let both = t.acquire(B, "k", &[C0, C1], &[C0, C1], 30_000, clock.now());
        assert_eq!(both.map(|i| i.connection), Ok(C1));
        clock.advance_ms(10_500);
        let third = t.acquire([3; 32], "k", &[C0, C1], &[C0, C1], 30_000, clock.now());
        // The earliest end is A's, 19.5 s away: rounded up.
        assert_eq!(
            third,
            Err(AcquireRefused::Capacity {
                eligible: 2,
                free: 0,
                retry_after_s: 20
            })
        );
    }

    #[test]
    fn expiry_is_lazy_and_frees_the_connection() {
        let clock = clock();
        let mut t = LeaseTable::default();
        assert!(t.acquire(A, "k", &[C0], &[C0], 1_000, clock.now()).is_ok());
        clock.advance_ms(999);
        assert_eq!(t.fence(&A, "k", 1, clock.now()), Fence::Valid(C0));
        clock.advance_ms(1);
        assert_eq!(
            t.get(&A).map(|l| l.state(clock.now())),
            Some(LeaseState::Expired)
        );
        assert_eq!(t.fence(&A, "k", 1, clock.now()), Fence::Stale);
        assert!(t.renew(&A, "k", 1, 1_000, clock.now()).is_none());
        assert!(t.status(&A, "k", 1, clock.now()).is_none());
        // Another owner may take the connection; A's next lease is generation 2.
        let b = t.acquire(B, "k", &[C0], &[C0], 1_000, clock.now());
        assert_eq!(b.map(|i| (i.connection, i.generation)), Ok((C0, 1)));
        let a = t.acquire(A, "k", &[C0, C1], &[C0, C1], 1_000, clock.now());
        assert_eq!(a.map(|i| (i.connection, i.generation)), Ok((C1, 2)));
    }

    #[test]
    fn renew_needs_the_exact_generation_and_key() {
        let clock = clock();
        let mut t = LeaseTable::default();
        assert!(t.acquire(A, "k", &[C0], &[C0], 2_000, clock.now()).is_ok());
        clock.advance_ms(1_500);
        assert!(t.renew(&A, "k", 2, 2_000, clock.now()).is_none());
        assert!(t.renew(&A, "x", 1, 2_000, clock.now()).is_none());
        assert!(t.renew(&B, "k", 1, 2_000, clock.now()).is_none());
        let renewed = t.renew(&A, "k", 1, 2_000, clock.now());
        assert!(renewed.is_some_and(|i| i.renewed_wall_ms == i.acquired_wall_ms + 1_500));
        clock.advance_ms(1_500);
        assert_eq!(t.fence(&A, "k", 1, clock.now()), Fence::Valid(C0));
    }

    #[test]
    fn the_ttl_is_clamped() {
        let clock = clock();
        let mut t = LeaseTable::default();
        let short = t.acquire(A, "k", &[C0], &[C0], 1, clock.now());
        assert_eq!(
            short.map(|i| i.expires_wall_ms - i.acquired_wall_ms),
            Ok(1_000)
        );
        let long = t.acquire(B, "k", &[C1], &[C1], u64::MAX, clock.now());
        assert_eq!(
            long.map(|i| i.expires_wall_ms - i.acquired_wall_ms),
            Ok(MAX_LEASE_TTL_MS)
        );
    }

    #[test]
    fn the_fence_tells_missing_stale_and_foreign_keys_apart() {
        let clock = clock();
        let mut t = LeaseTable::default();
        assert_eq!(t.fence(&A, "k", 1, clock.now()), Fence::Required);
        assert!(t.acquire(A, "k", &[C1], &[C1], 10_000, clock.now()).is_ok());
        assert_eq!(t.fence(&A, "k", 1, clock.now()), Fence::Valid(C1));
        assert_eq!(t.fence(&A, "k", 2, clock.now()), Fence::Stale);
        assert_eq!(
            t.fence(&A, "other", 1, clock.now()),
            Fence::AuthorizationMismatch
        );
        assert!(t.release(&A, "k", 1, clock.now()).is_some());
        assert_eq!(t.fence(&A, "k", 1, clock.now()), Fence::Stale);
    }

    #[test]
    fn invalidation_ends_a_lease_and_frees_its_connection() {
        let clock = clock();
        let mut t = LeaseTable::default();
        assert!(t.acquire(A, "k", &[C0], &[C0], 10_000, clock.now()).is_ok());
        assert!(t.acquire(B, "k", &[C1], &[C1], 10_000, clock.now()).is_ok());
        t.invalidate(clock.now(), |c, _| c != C0);
        assert_eq!(
            t.get(&A).map(|l| l.state(clock.now())),
            Some(LeaseState::Invalidated)
        );
        assert_eq!(t.fence(&A, "k", 1, clock.now()), Fence::Stale);
        assert_eq!(t.active(clock.now()), 1);
        let again = t.acquire(A, "k", &[C0], &[C0], 10_000, clock.now());
        assert_eq!(again.map(|i| i.generation), Ok(2));
    }

    #[test]
    fn the_sweep_forgets_owners_a_day_after_their_lease_ended() {
        let clock = clock();
        let mut t = LeaseTable::default();
        assert!(t.acquire(A, "k", &[C0], &[C0], 1_000, clock.now()).is_ok());
        clock.advance_ms(ENDED_LEASE_KEPT_MS);
        t.sweep(clock.now());
        assert!(t.get(&A).is_some(), "ended a day minus a second ago");
        clock.advance_ms(1_000);
        t.sweep(clock.now());
        assert!(t.get(&A).is_none());
        let fresh = t.acquire(A, "k", &[C0], &[C0], 1_000, clock.now());
        assert_eq!(fresh.map(|i| i.generation), Ok(1));
    }

    #[test]
    fn the_table_remembers_at_most_max_lease_owners_forgetting_the_longest_ended_first() {
        let clock = clock();
        let mut t = LeaseTable::default();
        let owner = |i: usize| {
            let mut o = [0xee; 32];
            o[..8].copy_from_slice(&(i as u64).to_le_bytes());
            o
        };
        // A client cycling fresh owner tokens: each acquires, then releases.
        for i in 0..MAX_LEASE_OWNERS + 10 {
            let got = t.acquire(owner(i), "k", &[C0], &[C0], 10_000, clock.now());
            assert!(got.is_ok(), "owner {i}: {got:?}");
            assert!(t.release(&owner(i), "k", 1, clock.now()).is_some());
            clock.advance_ms(1);
            assert!(t.by_owner.len() <= MAX_LEASE_OWNERS, "owner {i}");
        }
        // The longest-ended owner is forgotten (its next lease is generation 1 again); the
        // latest is remembered (generation 2).
        let first = t.acquire(owner(0), "k", &[C0], &[C0], 10_000, clock.now());
        assert_eq!(first.map(|i| i.generation), Ok(1));
        assert!(t.release(&owner(0), "k", 1, clock.now()).is_some());
        let last = owner(MAX_LEASE_OWNERS + 9);
        let again = t.acquire(last, "k", &[C0], &[C0], 10_000, clock.now());
        assert_eq!(again.map(|i| i.generation), Ok(2));
        // An active lease is never forgotten to make room.
        assert_eq!(t.fence(&last, "k", 2, clock.now()), Fence::Valid(C0));
        assert!(t.by_owner.len() <= MAX_LEASE_OWNERS);
    }

    #[test]
    fn changed_leases_are_reported_once_and_come_back_on_adoption() {
        let clock = clock();
        let mut t = LeaseTable::default();
        assert!(t.acquire(A, "k", &[C0], &[C0], 10_000, clock.now()).is_ok());
        assert!(t.acquire(B, "k", &[C1], &[C1], 10_000, clock.now()).is_ok());
        assert!(t.release(&B, "k", 1, clock.now()).is_some());
        clock.advance_ms(2_000);
        let changed = t.take_changed(clock.now(), 10);
        assert_eq!(changed.len(), 2);
        assert!(t.take_changed(clock.now(), 10).is_empty(), "reported once");
        // A restart 3 s later (another process: another monotonic epoch).
        let later = ManualClock::new(clock.now().wall_ms + 3_000);
        let mut back = LeaseTable::default();
        for (owner, p) in &changed {
            back.adopt(
                *owner,
                p.as_ref().unwrap_or_else(|| panic!("kept")),
                later.now(),
            );
        }
        // A's lease holds C0 until its end, 5 s from now; B's next lease is generation 2.
        assert_eq!(back.fence(&A, "k", 1, later.now()), Fence::Valid(C0));
        let taken = back.acquire([3; 32], "k", &[C0], &[C0], 10_000, later.now());
        assert_eq!(
            taken,
            Err(AcquireRefused::Capacity {
                eligible: 1,
                free: 0,
                retry_after_s: 5
            })
        );
        let b = back.acquire(B, "k", &[C1], &[C1], 10_000, later.now());
        assert_eq!(b.map(|i| i.generation), Ok(2));
        later.advance_ms(5_000);
        assert_eq!(back.fence(&A, "k", 1, later.now()), Fence::Stale);
        // Two persisted active leases on one connection: the second is invalidated.
        let mut twice = LeaseTable::default();
        let (_, a) = &changed[0];
        let a = a.clone().unwrap_or_else(|| panic!("kept"));
        twice.adopt(A, &a, clock.now());
        twice.adopt(B, &a, clock.now());
        assert_eq!(twice.fence(&B, "k", 1, clock.now()), Fence::Stale);
        assert_eq!(twice.fence(&A, "k", 1, clock.now()), Fence::Valid(C0));
    }
}
