//! The composite concurrency gate (spec B §2.1): counting semaphores keyed by [`GateKey`]
//! (global → provider → account → model, plus the quota-share `qsconn` slot of §2.3), owned
//! by the key owner's shard (ARCHITECTURE §3). This module owns the permits in use, the FIFO
//! wait queues with their deadlines, and the rule that decides who is granted next.
//!
//! # Rules
//!
//! * **All or nothing.** A request names every gate it needs ([`AcquireRequest::gates`]);
//!   it is granted all of them at once or none. A waiter holds no capacity, so a request that
//!   waits for a full account gate leaves its global slot to others.
//! * **FIFO per gate.** Waiters are granted in arrival order: whenever capacity frees, the
//!   table scans the queued waiters oldest first and grants every one whose gates all have
//!   room. A newcomer is granted at once only if no queued waiter could use the room (at
//!   rest — after every method returns — no queued waiter is grantable, so a newcomer only
//!   needs room on its gates). A waiter is therefore never overtaken on a gate while it
//!   could have been granted.
//! * **Unlimited.** A gate whose capacity is `None` or 0 is no gate: it is dropped from the
//!   request. Duplicate keys are merged keeping the smallest capacity; keys are sorted
//!   (`GateKey`'s order is global, provider, account, model, qsconn).
//! * **Capacity changes** (a PATCHed `max_concurrent` or a reload): every acquire carries
//!   its gates' capacities, so idle gates take the new value with their next acquire. An
//!   acquire naming a *lower* capacity applies it at once; one naming a *higher* capacity
//!   applies it only to a gate without waiters (else the newcomer could pass them). When
//!   the settings change, the gate home calls [`GateTable::reconfigure`], which applies
//!   the new capacities to every live gate and grants, oldest first, the waiters a rise
//!   lets in — so a busy gate rises at once. Permits already granted are never revoked.
//! * **Leaving the queue** (timeout, cancel) frees no capacity, so it grants nobody: only
//!   [`GateTable::release`] and capacity rises do.
//! * **Temporary blocking** (§2.1 rule 7, [`GateTable::mark_blocked`]): a blocked gate admits
//!   nothing — newcomers queue behind it, waiters stay queued — until [`GateTable::tick`]
//!   lifts the block at its end and grants the waiters that then fit, oldest first. A later
//!   block extends an earlier one, never shortens it. Permits already held are kept.
//! * **Deadlines.** A queued waiter whose deadline has passed times out
//!   ([`GateError::Timeout`]). A contended request whose deadline is already due is refused
//!   with `Timeout` at once (§2.1 rule 6: a zero wait budget is not "no deadline");
//!   `deadline: None` waits forever.
//!
//! # Time
//!
//! Every mutating method takes [`Now`]; before granting anything it times out overdue
//! waiters, so a waiter past its deadline is never granted even if the owner has not run
//! `GateTable::expire` yet. [`GateTable::next_deadline`] tells the owner when to wake
//! (the earliest waiter deadline or block end); it then calls [`GateTable::tick`].
//!
//! # Deviations from OmniRoute (copy to `docs/compat.md`)
//!
//! 1. OmniRoute's `acquireMany` queues a request behind *any* waiter on any of its gates
//!    (rule 2: "every gate has an empty wait queue"), so one saturated account with the
//!    global gate enabled stalls every other account's traffic (head-of-line blocking
//!    across accounts). Here a waiter blocks later ones only on a gate it could use: the
//!    oldest *grantable* waiter wins.
//! 2. Release is exactly-once by type (a [`Permit`] is consumed), not idempotent by lookup.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;

use crate::clock::Now;
use crate::config::{ConnectionId, ProviderId};

/// One semaphore's key. The derived order is the acquisition order of §2.1.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GateKey {
    /// `global`: `request_queue.global_concurrent_requests`.
    Global,
    /// `provider:<provider>`: `provider_quota_overrides[p].provider_concurrency`.
    Provider(ProviderId),
    /// `<provider>:<account>`: the connection's `max_concurrent`.
    Account(ConnectionId),
    /// `<provider>:<account>:model:<upstream model id>`: `model_concurrency[model]`.
    Model(ConnectionId, Box<str>),
    /// `qsconn:<connection>`: the quota-share serialization slot (§2.3).
    QuotaShare(ConnectionId),
    /// `combo:<combo>:<connection>:<model>`: a round-robin combo's per-model semaphore
    /// (§2.2); the combo by its id (`config::ComboId`, stable across reloads).
    Combo(u16, ConnectionId, Box<str>),
}

impl fmt::Display for GateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateKey::Global => f.write_str("global"),
            GateKey::Provider(p) => write!(f, "provider:{}", p.0),
            GateKey::Account(c) => write!(f, "account:{}", c.0),
            GateKey::Model(c, m) => write!(f, "account:{}:model:{m}", c.0),
            GateKey::QuotaShare(c) => write!(f, "qsconn:{}", c.0),
            GateKey::Combo(i, c, m) => write!(f, "combo:{i}:{}:{m}", c.0),
        }
    }
}

/// A gate a request needs, with the capacity its settings give it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateReq {
    pub key: GateKey,
    /// `None` or 0: no gate.
    pub capacity: Option<u32>,
}

impl GateReq {
    pub fn new(key: GateKey, capacity: Option<u32>) -> Self {
        Self { key, capacity }
    }
}

/// How many waiters a gate's queue may hold before new requests are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueLimit {
    /// Wait however many are waiting (`maxQueueDepth` 0 in the request path).
    Unbounded,
    /// Refuse when any involved gate already has this many waiters; `AtMost(0)` never
    /// queues (fail fast; combo `queueDepth` 0).
    AtMost(usize),
}

impl QueueLimit {
    /// The request path's reading of `request_queue.max_queue_depth`: 0 = unbounded.
    pub fn from_max_queue_depth(depth: u32) -> Self {
        match depth {
            0 => QueueLimit::Unbounded,
            d => QueueLimit::AtMost(usize::try_from(d).unwrap_or(usize::MAX)),
        }
    }
}

/// A request for every gate an attempt needs.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// The waiter's id, chosen by the owner, unique among queued waiters; grants and
    /// timeouts name it.
    pub id: u64,
    pub gates: Vec<GateReq>,
    /// Monotonic ns after which a queued request times out; `None` = no deadline.
    pub deadline: Option<u64>,
    pub max_queue: QueueLimit,
}

/// Why a request got no permit. Answered as `ErrorKind::SemaphoreTimeout` or
/// `SemaphoreQueueFull` (429; `error.rs` is the one map of status and code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateError {
    /// Waited past the deadline.
    Timeout,
    /// An involved gate's queue was full.
    QueueFull,
    /// The owner reused the id of a waiter still queued: a bug in the caller, refused so
    /// the queued waiter is not lost. Reported like a full queue.
    DuplicateWaiter,
}

/// Capacity held on a set of gates. Not `Clone`: giving it back to
/// [`GateTable::release`] consumes it, so a permit is released at most once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a permit must be released to the table"]
pub struct Permit {
    serial: u64,
    keys: Box<[GateKey]>,
}

impl Permit {
    /// The gates this permit holds (empty when every gate was unlimited).
    #[cfg(test)]
    pub fn keys(&self) -> &[GateKey] {
        &self.keys
    }

    /// Unique per table: tells permits apart in logs.
    pub fn serial(&self) -> u64 {
        self.serial
    }
}

/// The answer to [`GateTable::acquire`].
#[derive(Debug, PartialEq, Eq)]
pub enum Acquire {
    Granted(Permit),
    /// Waiting; a later [`Wakeups`] names the id with a permit or an error.
    Queued,
    Rejected(GateError),
}

/// Waiters whose fate was decided by a call: the owner wakes each of them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Wakeups {
    /// Granted, in grant order.
    pub granted: Vec<(u64, Permit)>,
    /// Timed out, in deadline order.
    pub timed_out: Vec<(u64, GateError)>,
}

impl Wakeups {
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.granted.is_empty() && self.timed_out.is_empty()
    }
}

/// The observable state of one gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg(test)]
pub struct GateStats {
    pub capacity: u32,
    pub in_use: u32,
    pub queued: usize,
}

#[derive(Debug)]
struct Gate {
    capacity: u32,
    in_use: u32,
    /// Waiter ids in arrival order.
    queue: VecDeque<u64>,
    /// Admits nothing until this monotonic instant (lifted by `tick`).
    blocked_until: Option<u64>,
}

impl Gate {
    fn new(capacity: u32) -> Self {
        Self {
            capacity,
            in_use: 0,
            queue: VecDeque::new(),
            blocked_until: None,
        }
    }

    fn has_room(&self) -> bool {
        self.in_use < self.capacity && self.blocked_until.is_none()
    }

    fn is_idle(&self) -> bool {
        self.in_use == 0 && self.queue.is_empty() && self.blocked_until.is_none()
    }
}

#[derive(Debug)]
struct Waiter {
    /// Arrival order; grants scan oldest first.
    seq: u64,
    keys: Box<[GateKey]>,
    deadline: Option<u64>,
}

/// The gates of one owner shard.
#[derive(Debug, Default)]
pub struct GateTable {
    gates: HashMap<GateKey, Gate>,
    waiters: HashMap<u64, Waiter>,
    /// Queued waiters with a deadline (deadline, id).
    deadlines: BTreeSet<(u64, u64)>,
    /// Blocked gates by the end of their block (until, key).
    blocks: BTreeSet<(u64, GateKey)>,
    next_seq: u64,
    next_serial: u64,
    outstanding: usize,
}

/// Drops unlimited gates, merges duplicates (smallest capacity wins) and sorts; in the
/// request's own vector (no allocation per acquire). Every gate left has a capacity > 0.
fn normalize(mut gates: Vec<GateReq>) -> Vec<GateReq> {
    gates.retain(|g| g.capacity.is_some_and(|c| c > 0));
    gates.sort_by(|a, b| a.key.cmp(&b.key).then(a.capacity.cmp(&b.capacity)));
    gates.dedup_by(|later, earlier| later.key == earlier.key);
    gates
}

/// The capacity of a gate [`normalize`] kept.
fn capacity(g: &GateReq) -> u32 {
    g.capacity.unwrap_or(u32::MAX)
}

impl GateTable {
    // benches/gates.rs builds tables directly.
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn new() -> Self {
        Self::default()
    }

    /// Tries to take every gate of `request` at once; queues it otherwise (holding nothing).
    pub fn acquire(&mut self, request: AcquireRequest, now: Now) -> Acquire {
        let AcquireRequest {
            id,
            gates,
            deadline,
            max_queue,
        } = request;
        let needs = normalize(gates);
        for need in &needs {
            let capacity = capacity(need);
            // Looked up before inserting: the key is cloned only for a gate not yet live.
            match self.gates.get_mut(&need.key) {
                // Lowering is always safe; raising a gate with waiters could let this
                // newcomer pass them, so it waits for `reconfigure`, which grants them first.
                Some(gate) => {
                    if capacity < gate.capacity || gate.queue.is_empty() {
                        gate.capacity = capacity;
                    }
                }
                None => {
                    self.gates.insert(need.key.clone(), Gate::new(capacity));
                }
            }
        }
        if needs
            .iter()
            .all(|g| self.gates.get(&g.key).is_some_and(Gate::has_room))
        {
            let keys: Box<[GateKey]> = needs.into_iter().map(|g| g.key).collect();
            return Acquire::Granted(self.take(keys));
        }
        if self.waiters.contains_key(&id) {
            return Acquire::Rejected(GateError::DuplicateWaiter);
        }
        let full = match max_queue {
            QueueLimit::Unbounded => false,
            QueueLimit::AtMost(max) => needs
                .iter()
                .any(|n| self.gates.get(&n.key).is_some_and(|g| g.queue.len() >= max)),
        };
        if full {
            self.forget_idle(needs.iter().map(|n| &n.key));
            return Acquire::Rejected(GateError::QueueFull);
        }
        if deadline.is_some_and(|d| d <= now.mono_ns) {
            self.forget_idle(needs.iter().map(|n| &n.key));
            return Acquire::Rejected(GateError::Timeout);
        }
        let keys: Box<[GateKey]> = needs.into_iter().map(|n| n.key).collect();
        for k in keys.iter() {
            if let Some(g) = self.gates.get_mut(k) {
                g.queue.push_back(id);
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(d) = deadline {
            self.deadlines.insert((d, id));
        }
        self.waiters.insert(
            id,
            Waiter {
                seq,
                keys,
                deadline,
            },
        );
        Acquire::Queued
    }

    /// Gives back the capacity `permit` holds and grants the waiters that now fit.
    pub fn release(&mut self, permit: Permit, now: Now) -> Wakeups {
        for k in permit.keys.iter() {
            if let Some(g) = self.gates.get_mut(k) {
                g.in_use = g.in_use.saturating_sub(1);
            }
        }
        self.outstanding = self.outstanding.saturating_sub(1);
        let mut wake = self.expire_only(now);
        self.grant_among(&permit.keys, &mut wake);
        self.forget_idle(permit.keys.iter());
        wake
    }

    /// Times out every queued waiter whose deadline is `<= now`. A departing waiter frees
    /// no capacity, so nobody is granted.
    #[cfg(test)]
    pub fn expire(&mut self, now: Now) -> Vec<(u64, GateError)> {
        self.expire_only(now).timed_out
    }

    /// Removes a queued waiter whose client went away; false if `id` was not queued
    /// (already granted, timed out or unknown). Frees no capacity, so grants nobody.
    pub fn cancel(&mut self, id: u64) -> bool {
        self.remove_waiter(id).is_some()
    }

    /// Applies new capacities to every live gate after settings were PATCHed or reloaded
    /// (`capacity_of` reads the new settings and is given the gate's capacity now; `None`/0
    /// lifts a gate for the permits and waiters already on it) and grants the waiters a
    /// larger capacity lets in, oldest first. Idle gates are not kept, so later acquires name
    /// their capacity themselves.
    pub fn reconfigure(
        &mut self,
        capacity_of: impl Fn(&GateKey, u32) -> Option<u32>,
        now: Now,
    ) -> Wakeups {
        let mut raised: Vec<GateKey> = Vec::new();
        for (k, g) in &mut self.gates {
            let cap = match capacity_of(k, g.capacity) {
                Some(c) if c > 0 => c,
                _ => u32::MAX,
            };
            if cap > g.capacity {
                raised.push(k.clone());
            }
            g.capacity = cap;
        }
        let mut wake = self.expire_only(now);
        self.grant_among(&raised, &mut wake);
        wake
    }

    /// [`Self::reconfigure`] for one gate.
    #[cfg(test)]
    pub fn set_capacity(&mut self, key: &GateKey, capacity: Option<u32>, now: Now) -> Wakeups {
        let mut raised = Vec::new();
        if let Some(g) = self.gates.get_mut(key) {
            let cap = match capacity {
                Some(c) if c > 0 => c,
                _ => u32::MAX,
            };
            if cap > g.capacity {
                raised.push(key.clone());
            }
            g.capacity = cap;
        }
        let mut wake = self.expire_only(now);
        self.grant_among(&raised, &mut wake);
        wake
    }

    /// Blocks gate `key` until `until_ns` (monotonic): it admits nothing before then. A
    /// block that ends earlier than one already in place changes nothing; one already over
    /// is ignored. The owner arms a wake-up at [`Self::next_deadline`] and calls
    /// [`Self::tick`] to lift it.
    pub fn mark_blocked(&mut self, key: GateKey, until_ns: u64, now: Now) {
        if until_ns <= now.mono_ns {
            return;
        }
        let gate = self
            .gates
            .entry(key.clone())
            .or_insert_with(|| Gate::new(u32::MAX));
        match gate.blocked_until {
            Some(old) if old >= until_ns => return,
            Some(old) => {
                self.blocks.remove(&(old, key.clone()));
            }
            None => {}
        }
        gate.blocked_until = Some(until_ns);
        self.blocks.insert((until_ns, key));
    }

    /// Whether `key` is blocked (its block not yet lifted by [`Self::tick`]).
    #[cfg(test)]
    pub fn is_blocked(&self, key: &GateKey) -> bool {
        self.gates
            .get(key)
            .is_some_and(|g| g.blocked_until.is_some())
    }

    /// The owner's timer: times out overdue waiters, lifts the blocks that are over and
    /// grants the waiters that then fit, oldest first.
    pub fn tick(&mut self, now: Now) -> Wakeups {
        let mut wake = self.expire_only(now);
        let mut lifted = Vec::new();
        while let Some((until, _)) = self.blocks.first() {
            if *until > now.mono_ns {
                break;
            }
            if let Some((_, key)) = self.blocks.pop_first() {
                if let Some(g) = self.gates.get_mut(&key) {
                    g.blocked_until = None;
                }
                lifted.push(key);
            }
        }
        self.grant_among(&lifted, &mut wake);
        self.forget_idle(lifted.iter());
        wake
    }

    /// When the owner should call [`Self::tick`]: the earliest deadline of a queued waiter
    /// or end of a block.
    pub fn next_deadline(&self) -> Option<u64> {
        let deadline = self.deadlines.first().map(|(d, _)| *d);
        let block = self.blocks.first().map(|(u, _)| *u);
        match (deadline, block) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Permits granted and not yet released.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Waiters currently queued.
    pub fn queued(&self) -> usize {
        self.waiters.len()
    }

    #[cfg(test)]
    pub fn is_queued(&self, id: u64) -> bool {
        self.waiters.contains_key(&id)
    }

    /// One gate's state; `None` for a gate that is idle (no permit, no waiter) or unknown.
    #[cfg(test)]
    pub fn stats(&self, key: &GateKey) -> Option<GateStats> {
        self.gates.get(key).map(|g| GateStats {
            capacity: g.capacity,
            in_use: g.in_use,
            queued: g.queue.len(),
        })
    }

    /// Checks the table's internal consistency (for tests and debug builds): every queued
    /// id is a waiter that needs that gate and every waiter sits in the queue of each gate
    /// it needs, no idle gate is kept, and no queued waiter is grantable at rest (the
    /// all-or-nothing FIFO rule). Capacity and the permit count are checked by the
    /// property test against its own model ([`Self::outstanding`]).
    #[cfg(test)]
    pub fn check_invariants(&self) -> Result<(), String> {
        for (k, g) in &self.gates {
            for id in &g.queue {
                let Some(w) = self.waiters.get(id) else {
                    return Err(format!("gate {k} queues unknown waiter {id}"));
                };
                if !w.keys.contains(k) {
                    return Err(format!("gate {k} queues waiter {id} that does not need it"));
                }
            }
            if g.is_idle() {
                return Err(format!("idle gate {k} kept"));
            }
            if let Some(until) = g.blocked_until
                && !self.blocks.contains(&(until, k.clone()))
            {
                return Err(format!("blocked gate {k} missing from the block index"));
            }
        }
        for (id, w) in &self.waiters {
            for k in w.keys.iter() {
                if !self.gates.get(k).is_some_and(|g| g.queue.contains(id)) {
                    return Err(format!("waiter {id} missing from queue of {k}"));
                }
            }
            if self.grantable(w) {
                return Err(format!("waiter {id} is grantable at rest"));
            }
        }
        Ok(())
    }

    fn grantable(&self, w: &Waiter) -> bool {
        w.keys
            .iter()
            .all(|k| self.gates.get(k).is_some_and(Gate::has_room))
    }

    fn take(&mut self, keys: Box<[GateKey]>) -> Permit {
        for k in keys.iter() {
            if let Some(g) = self.gates.get_mut(k) {
                g.in_use += 1;
            }
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        self.outstanding += 1;
        Permit { serial, keys }
    }

    fn remove_waiter(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        if let Some(d) = w.deadline {
            self.deadlines.remove(&(d, id));
        }
        for k in w.keys.iter() {
            if let Some(g) = self.gates.get_mut(k) {
                g.queue.retain(|q| *q != id);
            }
        }
        self.forget_idle(w.keys.iter());
        Some(w)
    }

    fn expire_only(&mut self, now: Now) -> Wakeups {
        let mut wake = Wakeups::default();
        while let Some(&(d, id)) = self.deadlines.first() {
            if d > now.mono_ns {
                break;
            }
            self.remove_waiter(id);
            wake.timed_out.push((id, GateError::Timeout));
        }
        wake
    }

    /// Grants, oldest first, the waiters on `keys` that now fit. At rest no waiter fits,
    /// and only room on `keys` changed, so only their waiters can; a grant only uses room,
    /// so one pass in arrival order suffices.
    fn grant_among(&mut self, keys: &[GateKey], wake: &mut Wakeups) {
        let mut candidates: Vec<(u64, u64)> = keys
            .iter()
            .filter_map(|k| self.gates.get(k))
            .flat_map(|g| g.queue.iter())
            .filter_map(|id| self.waiters.get(id).map(|w| (w.seq, *id)))
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        for (_, id) in candidates {
            if !self.waiters.get(&id).is_some_and(|w| self.grantable(w)) {
                continue;
            }
            if let Some(w) = self.remove_waiter_keep_gates(id) {
                let permit = self.take(w.keys);
                wake.granted.push((id, permit));
            }
        }
    }

    /// Like `remove_waiter` but never forgets the gates (they are about to be taken).
    fn remove_waiter_keep_gates(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        if let Some(d) = w.deadline {
            self.deadlines.remove(&(d, id));
        }
        for k in w.keys.iter() {
            if let Some(g) = self.gates.get_mut(k) {
                g.queue.retain(|q| *q != id);
            }
        }
        Some(w)
    }

    /// Drops gates with no permit and no waiter (§2.1: idle gates disappear).
    fn forget_idle<'a>(&mut self, keys: impl Iterator<Item = &'a GateKey>) {
        for k in keys {
            if self.gates.get(k).is_some_and(Gate::is_idle) {
                self.gates.remove(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(ms: u64) -> Now {
        Now {
            mono_ns: ms * 1_000_000,
            wall_ms: 1_700_000_000_000 + ms,
        }
    }

    fn ms(v: u64) -> u64 {
        v * 1_000_000
    }

    const A: ConnectionId = ConnectionId(1);
    const B: ConnectionId = ConnectionId(2);

    fn req(id: u64, gates: &[(GateKey, Option<u32>)], deadline_ms: Option<u64>) -> AcquireRequest {
        AcquireRequest {
            id,
            gates: gates
                .iter()
                .map(|(k, c)| GateReq::new(k.clone(), *c))
                .collect(),
            deadline: deadline_ms.map(ms),
            max_queue: QueueLimit::Unbounded,
        }
    }

    fn granted(a: Acquire) -> Permit {
        match a {
            Acquire::Granted(p) => p,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    fn ids(w: &Wakeups) -> Vec<u64> {
        w.granted.iter().map(|(id, _)| *id).collect()
    }

    #[test]
    fn grants_queues_and_releases_in_order() {
        let mut t = GateTable::new();
        let g = [(GateKey::Account(A), Some(1))];
        let p1 = granted(t.acquire(req(1, &g, None), at(0)));
        assert_eq!(p1.keys(), &[GateKey::Account(A)]);
        assert_eq!(t.acquire(req(2, &g, None), at(1)), Acquire::Queued);
        assert_eq!(t.acquire(req(3, &g, None), at(2)), Acquire::Queued);
        assert_eq!(
            t.stats(&GateKey::Account(A)),
            Some(GateStats {
                capacity: 1,
                in_use: 1,
                queued: 2
            })
        );
        let mut w = t.release(p1, at(3));
        assert_eq!(ids(&w), vec![2]);
        let (_, p2) = w.granted.remove(0);
        let mut w = t.release(p2, at(4));
        assert_eq!(ids(&w), vec![3]);
        let (_, p3) = w.granted.remove(0);
        assert!(t.release(p3, at(5)).is_empty());
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.stats(&GateKey::Account(A)), None, "idle gates disappear");
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_blocked_gate_admits_nothing_until_the_tick_that_lifts_it() {
        let mut t = GateTable::new();
        let g = [(GateKey::Account(A), Some(2))];
        let held = granted(t.acquire(req(1, &g, None), at(0)));
        t.mark_blocked(GateKey::Account(A), ms(100), at(10));
        assert!(t.is_blocked(&GateKey::Account(A)));
        // Room, but blocked: newcomers queue; the permit already held is kept.
        assert_eq!(t.acquire(req(2, &g, None), at(20)), Acquire::Queued);
        assert_eq!(t.acquire(req(3, &g, Some(50)), at(30)), Acquire::Queued);
        // A shorter block changes nothing; the next wake-up is the earliest of the
        // waiter's deadline and the block's end.
        t.mark_blocked(GateKey::Account(A), ms(60), at(30));
        assert_eq!(t.next_deadline(), Some(ms(50)));
        // Releasing during the block grants nobody.
        assert!(t.release(held, at(40)).granted.is_empty());
        let w = t.tick(at(50));
        assert_eq!(
            (ids(&w), w.timed_out.len()),
            (vec![], 1),
            "waiter 3 timed out"
        );
        assert_eq!(t.next_deadline(), Some(ms(100)));
        assert!(t.tick(at(99)).is_empty());
        // Other gates are not affected.
        let other = granted(t.acquire(req(4, &[(GateKey::Account(B), Some(1))], None), at(99)));
        let w = t.tick(at(100));
        assert_eq!(ids(&w), vec![2]);
        assert!(!t.is_blocked(&GateKey::Account(A)));
        t.check_invariants().unwrap();
        // A block on an idle gate keeps it until lifted; one already over is ignored.
        t.mark_blocked(GateKey::Global, ms(90), at(100));
        assert!(!t.is_blocked(&GateKey::Global));
        t.mark_blocked(GateKey::Global, ms(200), at(100));
        assert!(t.is_blocked(&GateKey::Global));
        t.check_invariants().unwrap();
        assert!(t.tick(at(200)).is_empty());
        assert_eq!(
            t.stats(&GateKey::Global),
            None,
            "an idle gate goes once unblocked"
        );
        drop(other);
    }

    #[test]
    fn waiter_holds_nothing_and_global_stays_available() {
        let mut t = GateTable::new();
        let holder = granted(t.acquire(req(1, &[(GateKey::Account(A), Some(1))], None), at(0)));
        let chain_a = [(GateKey::Global, Some(1)), (GateKey::Account(A), Some(1))];
        assert_eq!(t.acquire(req(2, &chain_a, None), at(1)), Acquire::Queued);
        assert_eq!(t.stats(&GateKey::Global).map(|s| s.in_use), Some(0));
        // Another account's request takes the global slot the waiter does not hold.
        let chain_b = [(GateKey::Global, Some(1)), (GateKey::Account(B), Some(1))];
        let other = granted(t.acquire(req(3, &chain_b, None), at(2)));
        assert_eq!(t.stats(&GateKey::Global).map(|s| s.in_use), Some(1));
        // Account A frees, but global is now busy: the waiter still holds nothing.
        assert!(t.release(holder, at(3)).is_empty());
        assert_eq!(t.stats(&GateKey::Account(A)).map(|s| s.in_use), Some(0));
        t.check_invariants().unwrap();
        let w = t.release(other, at(4));
        assert_eq!(ids(&w), vec![2]);
        assert_eq!(
            w.granted[0].1.keys(),
            &[GateKey::Global, GateKey::Account(A)]
        );
        for (_, p) in w.granted {
            let _ = t.release(p, at(5));
        }
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn fifo_per_gate() {
        let mut t = GateTable::new();
        let g = [(GateKey::Global, Some(2))];
        let p1 = granted(t.acquire(req(1, &g, None), at(0)));
        let p2 = granted(t.acquire(req(2, &g, None), at(0)));
        for id in 3..=6 {
            assert_eq!(t.acquire(req(id, &g, None), at(id)), Acquire::Queued);
        }
        let w = t.release(p2, at(10));
        assert_eq!(ids(&w), vec![3]);
        let w2 = t.release(p1, at(11));
        assert_eq!(ids(&w2), vec![4]);
        // A newcomer does not jump the waiters: there is no room.
        assert_eq!(t.acquire(req(7, &g, None), at(12)), Acquire::Queued);
        let mut order = Vec::new();
        let mut held: Vec<Permit> = w
            .granted
            .into_iter()
            .chain(w2.granted)
            .map(|(_, p)| p)
            .collect();
        while let Some(p) = held.pop() {
            let w = t.release(p, at(20));
            order.extend(ids(&w));
            held.extend(w.granted.into_iter().map(|(_, p)| p));
        }
        assert_eq!(order, vec![5, 6, 7]);
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn timeout_and_zero_budget() {
        let mut t = GateTable::new();
        let g = [(GateKey::Account(A), Some(1))];
        let p = granted(t.acquire(req(1, &g, Some(0)), at(0)));
        assert_eq!(t.acquire(req(2, &g, Some(100)), at(0)), Acquire::Queued);
        assert_eq!(t.next_deadline(), Some(ms(100)));
        // A zero wait budget on a contended gate is refused at once (§2.1 rule 6).
        assert_eq!(
            t.acquire(req(3, &g, Some(5)), at(5)),
            Acquire::Rejected(GateError::Timeout)
        );
        assert!(t.expire(at(99)).is_empty());
        let w = t.expire(at(100));
        assert_eq!(w, vec![(2, GateError::Timeout)]);
        assert!(!t.is_queued(2));
        assert_eq!(t.next_deadline(), None);
        assert!(t.release(p, at(101)).is_empty());
    }

    #[test]
    fn overdue_waiter_is_never_granted_by_release() {
        let mut t = GateTable::new();
        let g = [(GateKey::Account(A), Some(1))];
        let p = granted(t.acquire(req(1, &g, None), at(0)));
        assert_eq!(t.acquire(req(2, &g, Some(10)), at(0)), Acquire::Queued);
        assert_eq!(t.acquire(req(3, &g, None), at(0)), Acquire::Queued);
        let w = t.release(p, at(50));
        assert_eq!(w.timed_out, vec![(2, GateError::Timeout)]);
        assert_eq!(ids(&w), vec![3]);
    }

    #[test]
    fn queue_full() {
        let mut t = GateTable::new();
        let g = [(GateKey::Account(A), Some(1))];
        let _p = granted(t.acquire(req(1, &g, None), at(0)));
        let mut r = req(2, &g, None);
        r.max_queue = QueueLimit::AtMost(1);
        assert_eq!(t.acquire(r.clone(), at(0)), Acquire::Queued);
        r.id = 3;
        assert_eq!(
            t.acquire(r.clone(), at(0)),
            Acquire::Rejected(GateError::QueueFull)
        );
        r.id = 4;
        r.max_queue = QueueLimit::AtMost(0);
        assert_eq!(t.acquire(r, at(0)), Acquire::Rejected(GateError::QueueFull));
        assert_eq!(QueueLimit::from_max_queue_depth(0), QueueLimit::Unbounded);
        assert_eq!(QueueLimit::from_max_queue_depth(3), QueueLimit::AtMost(3));
        // A queued id cannot be reused.
        assert_eq!(
            t.acquire(req(2, &g, None), at(0)),
            Acquire::Rejected(GateError::DuplicateWaiter)
        );
    }

    #[test]
    fn unlimited_keys_and_duplicates() {
        let mut t = GateTable::new();
        let g = [
            (GateKey::Global, None),
            (GateKey::Provider(ProviderId(0)), Some(0)),
            (GateKey::Model(A, "m".into()), Some(5)),
            (GateKey::Account(A), Some(3)),
            (GateKey::Model(A, "m".into()), Some(1)),
        ];
        let p = granted(t.acquire(req(1, &g, None), at(0)));
        assert_eq!(
            p.keys(),
            &[GateKey::Account(A), GateKey::Model(A, "m".into())]
        );
        assert_eq!(
            t.stats(&GateKey::Model(A, "m".into())).map(|s| s.capacity),
            Some(1)
        );
        assert_eq!(t.stats(&GateKey::Global), None);
        let free: Vec<Permit> = (10..20)
            .map(|id| granted(t.acquire(req(id, &[(GateKey::Global, None)], None), at(0))))
            .collect();
        assert!(free.iter().all(|p| p.keys().is_empty()));
        assert_eq!(t.outstanding(), 11);
        for p in free {
            let _ = t.release(p, at(1));
        }
        let _ = t.release(p, at(1));
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn cancel_unblocks_later_waiters_and_capacity_changes_apply() {
        let mut t = GateTable::new();
        let holder = granted(t.acquire(req(1, &[(GateKey::Account(A), Some(1))], None), at(0)));
        let g = [(GateKey::Global, Some(1)), (GateKey::Account(A), Some(1))];
        assert_eq!(t.acquire(req(2, &g, None), at(0)), Acquire::Queued);
        assert!(t.cancel(2));
        assert!(!t.cancel(2));
        assert_eq!(t.acquire(req(3, &g, None), at(2)), Acquire::Queued);
        assert_eq!(t.acquire(req(4, &g, None), at(2)), Acquire::Queued);
        let w = t.set_capacity(&GateKey::Account(A), Some(2), at(3));
        assert_eq!(ids(&w), vec![3]);
        // The next acquire's capacity wins for the gate.
        assert_eq!(
            t.acquire(req(5, &[(GateKey::Account(A), Some(1))], None), at(4)),
            Acquire::Queued
        );
        assert_eq!(t.stats(&GateKey::Account(A)).map(|s| s.capacity), Some(1));
        t.check_invariants().unwrap();
        let mut all: Vec<Permit> = w.granted.into_iter().map(|(_, p)| p).collect();
        all.push(holder);
        let mut order = Vec::new();
        while let Some(p) = all.pop() {
            let w = t.release(p, at(5));
            order.extend(ids(&w));
            all.extend(w.granted.into_iter().map(|(_, p)| p));
        }
        order.sort();
        assert_eq!(order, vec![4, 5]);
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.queued(), 0);
    }

    #[test]
    fn raised_capacity_never_lets_a_newcomer_pass_waiters() {
        let mut t = GateTable::new();
        let g1 = [(GateKey::Account(A), Some(1))];
        let p = granted(t.acquire(req(1, &g1, None), at(0)));
        assert_eq!(t.acquire(req(2, &g1, None), at(0)), Acquire::Queued);
        // Settings now say 2, but the waiter came first: the newcomer queues behind it.
        let g2 = [(GateKey::Account(A), Some(2))];
        assert_eq!(t.acquire(req(3, &g2, None), at(1)), Acquire::Queued);
        t.check_invariants().unwrap();
        let w = t.reconfigure(|_, _| Some(2), at(2));
        assert_eq!(ids(&w), vec![2]);
        assert_eq!(t.stats(&GateKey::Account(A)).map(|s| s.capacity), Some(2));
        // Lowering applies at once through an acquire.
        let g0 = [(GateKey::Account(A), Some(1))];
        assert_eq!(t.acquire(req(4, &g0, None), at(3)), Acquire::Queued);
        let w2 = t.release(p, at(4));
        assert!(w2.is_empty(), "still 1 in use at capacity 1");
        for (_, p) in w.granted {
            let w = t.release(p, at(5));
            assert_eq!(ids(&w), vec![3]);
            for (_, p) in w.granted {
                assert_eq!(ids(&t.release(p, at(6))), vec![4]);
            }
        }
    }

    // ---- property test: random interleavings against a reference model ----

    #[derive(Clone, Debug)]
    enum Op {
        Acquire {
            keys: Vec<usize>,
            wait_ms: Option<u64>,
            max_queue: Option<usize>,
        },
        Release(usize),
        Advance(u64),
        Expire,
        Cancel(usize),
        /// Settings change every limited gate to `1 + delta`; `true`: the owner also
        /// calls `reconfigure` (else only later acquires carry the new capacities, and
        /// capacities only rise).
        Reconfigure([u32; 6], bool),
        /// Block gate `key(i)` for this many ms.
        Block(usize, u64),
        /// The owner's timer: `tick`.
        Tick,
    }

    fn key(i: usize) -> GateKey {
        match i {
            0 => GateKey::Global,
            1 => GateKey::Provider(ProviderId(0)),
            2 => GateKey::Account(A),
            3 => GateKey::Account(B),
            4 => GateKey::Model(A, "m".into()),
            _ => GateKey::QuotaShare(B),
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (
                prop::collection::vec(0usize..6, 0..4),
                prop::option::of(0u64..50),
                prop::option::of(0usize..3),
            )
                .prop_map(|(keys, wait_ms, max_queue)| Op::Acquire { keys, wait_ms, max_queue }),
            3 => (0usize..64).prop_map(Op::Release),
            2 => (0u64..30).prop_map(Op::Advance),
            1 => Just(Op::Expire),
            1 => (0usize..64).prop_map(Op::Cancel),
            1 => (prop::array::uniform6(0u32..3), any::<bool>())
                .prop_map(|(d, apply)| Op::Reconfigure(d, apply)),
            1 => (0usize..6, 0u64..40).prop_map(|(i, d)| Op::Block(i, d)),
            1 => Just(Op::Tick),
        ]
    }

    struct Run {
        caps: [u32; 6],
        /// Blocks not yet lifted by a tick (until, ms).
        blocked: [Option<u64>; 6],
        held: Vec<(u64, Permit)>,
        /// Waiter id → keys it asked for (normalized).
        waiting: HashMap<u64, Vec<GateKey>>,
        requests: usize,
        grants: usize,
        timeouts: usize,
        cancels: usize,
        rejections: usize,
        released: usize,
    }

    impl Run {
        fn absorb(&mut self, t: &GateTable, w: Wakeups) -> Result<(), TestCaseError> {
            // FIFO per gate: granting only consumes capacity, so a batch grants oldest first
            // (ids grow with arrival), and `check_invariants` proves no queued waiter is left
            // grantable at rest, so no one is ever overtaken while it could be granted.
            let granted: Vec<u64> = w.granted.iter().map(|(id, _)| *id).collect();
            for (id, p) in w.granted {
                let want = self.waiting.remove(&id);
                prop_assert!(
                    want.is_some(),
                    "granted a waiter that was not queued: {}",
                    id
                );
                let want = want.unwrap_or_default();
                prop_assert_eq!(want.as_slice(), p.keys(), "partial or wrong set");
                self.grants += 1;
                self.held.push((id, p));
                self.check_grant()?;
            }
            for (id, e) in w.timed_out {
                prop_assert_eq!(e, GateError::Timeout);
                prop_assert!(self.waiting.remove(&id).is_some());
                self.timeouts += 1;
            }
            for pair in granted.windows(2) {
                prop_assert!(
                    pair[0] < pair[1],
                    "grants out of arrival order: {:?}",
                    granted
                );
            }
            let _ = t;
            Ok(())
        }

        /// Granting never takes a gate past the capacity the settings give it now, nor
        /// passes a block that is not lifted.
        fn check_grant(&self) -> Result<(), TestCaseError> {
            let Some((_, p)) = self.held.last() else {
                return Ok(());
            };
            for k in p.keys() {
                let i = (0..6).find(|i| key(*i) == *k).unwrap_or(0);
                prop_assert!(
                    self.blocked[i].is_none(),
                    "granted through blocked gate {}",
                    k
                );
                let in_use = self
                    .held
                    .iter()
                    .filter(|(_, p)| p.keys().contains(k))
                    .count();
                prop_assert!(in_use <= self.caps[i] as usize, "gate {} over capacity", k);
            }
            Ok(())
        }

        fn check(&self, t: &GateTable) -> Result<(), TestCaseError> {
            prop_assert!(t.check_invariants().is_ok(), "{:?}", t.check_invariants());
            prop_assert_eq!(t.outstanding(), self.held.len());
            prop_assert_eq!(t.queued(), self.waiting.len());
            for i in 0..6 {
                let k = key(i);
                let in_use = self
                    .held
                    .iter()
                    .filter(|(_, p)| p.keys().contains(&k))
                    .count();
                let stats_in_use = t.stats(&k).map_or(0, |s| s.in_use as usize);
                prop_assert_eq!(in_use, stats_in_use);
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn gate_invariants(
            caps in prop::array::uniform6(0u32..3),
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut t = GateTable::new();
            let mut run = Run {
                caps: caps.map(|c| if c == 0 { u32::MAX } else { c }),
                blocked: [None; 6],
                held: Vec::new(),
                waiting: HashMap::new(),
                requests: 0, grants: 0, timeouts: 0, cancels: 0, rejections: 0, released: 0,
            };
            let mut now_ms = 0u64;
            let mut next_id = 0u64;
            for op in ops {
                let now = at(now_ms);
                match op {
                    Op::Acquire { keys, wait_ms, max_queue } => {
                        next_id += 1;
                        run.requests += 1;
                        let gates: Vec<GateReq> = keys
                            .iter()
                            .map(|i| GateReq::new(key(*i), Some(run.caps[*i]).filter(|_| caps[*i] > 0)))
                            .collect();
                        let mut want: Vec<GateKey> =
                            gates.iter().filter(|g| g.capacity.is_some()).map(|g| g.key.clone()).collect();
                        want.sort();
                        want.dedup();
                        let r = AcquireRequest {
                            id: next_id,
                            gates,
                            deadline: wait_ms.map(|w| ms(now_ms + w)),
                            max_queue: max_queue.map_or(QueueLimit::Unbounded, QueueLimit::AtMost),
                        };
                        match t.acquire(r, now) {
                            Acquire::Granted(p) => {
                                prop_assert_eq!(p.keys(), want.as_slice());
                                run.grants += 1;
                                run.held.push((next_id, p));
                                run.check_grant()?;
                            }
                            Acquire::Queued => { run.waiting.insert(next_id, want); }
                            Acquire::Rejected(_) => run.rejections += 1,
                        }
                    }
                    Op::Release(i) => {
                        if !run.held.is_empty() {
                            let (_, p) = run.held.swap_remove(i % run.held.len());
                            run.released += 1;
                            let w = t.release(p, now);
                            run.absorb(&t, w)?;
                        }
                    }
                    Op::Advance(d) => now_ms += d,
                    Op::Expire => {
                        let timed_out = t.expire(now);
                        run.absorb(&t, Wakeups { granted: Vec::new(), timed_out })?;
                    }
                    Op::Reconfigure(delta, apply) => {
                        // Without `reconfigure` the table only learns capacities from later
                        // acquires, so the model lets settings only rise then (a lowered
                        // capacity is applied by `reconfigure` on the PATCH).
                        for (i, c) in run.caps.iter_mut().enumerate() {
                            let new = if caps[i] == 0 { u32::MAX } else { 1 + delta[i] };
                            *c = if apply { new } else { new.max(*c) };
                        }
                        if apply {
                            let now_caps = run.caps;
                            let cap_of = |k: &GateKey, _| (0..6).find(|i| key(*i) == *k).map(|i| now_caps[i]);
                            let w = t.reconfigure(cap_of, now);
                            run.absorb(&t, w)?;
                        }
                    }
                    Op::Block(i, d) => {
                        t.mark_blocked(key(i), ms(now_ms + d), now);
                        if d > 0 {
                            let until = run.blocked[i].map_or(now_ms + d, |u| u.max(now_ms + d));
                            run.blocked[i] = Some(until);
                        }
                    }
                    Op::Tick => {
                        for b in &mut run.blocked {
                            if b.is_some_and(|u| u <= now_ms) {
                                *b = None;
                            }
                        }
                        let w = t.tick(now);
                        run.absorb(&t, w)?;
                        for i in 0..6 {
                            prop_assert_eq!(t.is_blocked(&key(i)), run.blocked[i].is_some());
                        }
                    }
                    Op::Cancel(i) => {
                        let mut queued: Vec<u64> = run.waiting.keys().copied().collect();
                        queued.sort_unstable();
                        if !queued.is_empty() {
                            let id = queued[i % queued.len()];
                            prop_assert!(t.cancel(id));
                            prop_assert!(run.waiting.remove(&id).is_some());
                            run.cancels += 1;
                        }
                    }
                }
                run.check(&t)?;
            }
            // Drain: lift every block, release everything, then expire the rest far in the
            // future.
            let end = now_ms + 1_000;
            run.blocked = [None; 6];
            let w = t.tick(at(end));
            run.absorb(&t, w)?;
            now_ms = end;
            while let Some((_, p)) = run.held.pop() {
                run.released += 1;
                let w = t.release(p, at(now_ms));
                run.absorb(&t, w)?;
                run.check(&t)?;
            }
            let timed_out = t.expire(at(u64::MAX / 2_000_000));
            run.absorb(&t, Wakeups { granted: Vec::new(), timed_out })?;
            while let Some((_, p)) = run.held.pop() {
                run.released += 1;
                let w = t.release(p, at(u64::MAX / 2_000_000));
                run.absorb(&t, w)?;
            }
            // Waiters without a deadline and never granted can remain only if nothing is held.
            let stuck = run.waiting.len();
            prop_assert_eq!(stuck, 0, "a waiter was left queued with every gate free");
            prop_assert_eq!(run.grants + run.timeouts + run.cancels + run.rejections, run.requests);
            prop_assert_eq!(run.released, run.grants);
            prop_assert_eq!(t.outstanding(), 0);
        }
    }
}
