//! Quota-share dispatch (spec B §2.3, §2.4): the `qsconn:<connection>` serialization slot
//! (a thin use of [`crate::flow::gates`], fail-open) and [`QuotaShareSelector`], which owns
//! the per-combo deficit-round-robin state and the per-connection in-flight counters that
//! `selectQuotaShareTarget` reads. Both live on the owner shard of the combo / connection.
//!
//! # Selection (§2.4)
//!
//! 1. bucket gate: targets whose connection is saturated in `5h`, `7d` or `7d:<bareModel>`
//!    go to a saturated tail (all saturated: nothing moves);
//! 2. cap gate (only with a non-empty caps map): targets whose connection has
//!    `in_flight >= cap` go to an at-cap tail (none with room: nothing moves);
//! 3. deficit round robin over the targets with room (weights normalised per call, winner
//!    pays exactly 1, ties to the earliest; a single candidate leaves the state untouched;
//!    at most [`MAX_DRR_COMBOS`] combos, oldest inserted evicted);
//! 4. power of two choices: the DRR winner against the first other candidate in input
//!    order; the other wins only with *strictly* fewer in flight;
//! 5. the chosen connection's in-flight counter is taken as an [`InflightTicket`].
//!
//! # Decisions
//!
//! * The spec's P2C step is deterministic (position 0 against position 1), so no random
//!   source is injected: the same state and inputs always give the same choice.
//! * The in-flight lease (§2.4 step 5, value not found in OmniRoute) is
//!   [`INFLIGHT_LEASE_MS`], the default execution budget: a ticket never released stops
//!   counting after it, and releasing it later is a no-op.
//! * A target without a connection counts 0 in flight in the P2C comparison.
//! * The bare model of a model string without `/` is the whole string.
//! * Deficits are `f64`: the fractions weight/Σweights with small integer weights sum
//!   exactly enough that a 3:1 split is exactly 300:100 over 400 picks (tested).

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::clock::Now;
use crate::config::ConnectionId;
use crate::flow::gates::{
    Acquire, AcquireRequest, GateKey, GateReq, GateTable, Permit, QueueLimit,
};

/// Combo `queueTimeoutMs` default: how long a request waits for its `qsconn` slot.
#[cfg(test)]
pub const QS_QUEUE_TIMEOUT_MS: u64 = 30_000;
/// Combo `queueDepth` default: waiters per `qsconn` slot before failing open.
#[cfg(test)]
pub const QS_QUEUE_DEPTH: usize = 20;
/// Deficit state is kept for at most this many combos (§2.4 step 3).
pub const MAX_DRR_COMBOS: usize = 200;
/// An in-flight ticket never released stops counting after this long.
pub const INFLIGHT_LEASE_MS: u64 = 600_000;

// ---------------------------------------------------------------------------------------
// §2.3 the qsconn slot
// ---------------------------------------------------------------------------------------

/// A request for a connection's quota-share slot.
#[derive(Clone, Debug)]
pub struct SlotRequest {
    /// Waiter id (as for [`AcquireRequest::id`]).
    pub id: u64,
    pub connection: Option<ConnectionId>,
    /// The connection's `max_concurrent`; `None`/0 = no slot.
    pub max_concurrent: Option<u32>,
    /// Monotonic ns; usually `now + queue_timeout_ms`.
    pub deadline: Option<u64>,
    /// Combo `queueDepth`: 0 never queues (fail open at once).
    pub queue_depth: usize,
}

/// The answer to [`acquire_slot`].
#[derive(Debug, PartialEq, Eq)]
pub enum SlotAcquire {
    /// Holding the slot; release it through the gate table.
    Slot(Permit),
    /// Waiting; the gate table's wake-ups name the id. A timeout there means: proceed
    /// without a slot (fail open).
    Queued,
    /// Proceed without a slot: disabled, no connection, no cap, or the slot could not be
    /// had (queue full, zero budget).
    NoSlot,
}

/// The gate key of a connection's quota-share slot.
pub fn qsconn_key(connection: ConnectionId) -> GateKey {
    GateKey::QuotaShare(connection)
}

/// Takes `qsconn:<connection>` (§2.3). `enabled` is
/// `resilience.quota_share_concurrency_limit.enabled`. Never fails: anything but a grant or
/// a wait is [`SlotAcquire::NoSlot`].
pub fn acquire_slot(
    table: &mut GateTable,
    enabled: bool,
    request: SlotRequest,
    now: Now,
) -> SlotAcquire {
    let SlotRequest {
        id,
        connection,
        max_concurrent,
        deadline,
        queue_depth,
    } = request;
    let (Some(connection), Some(cap)) = (connection, max_concurrent.filter(|c| *c > 0)) else {
        return SlotAcquire::NoSlot;
    };
    if !enabled {
        return SlotAcquire::NoSlot;
    }
    let request = AcquireRequest {
        id,
        gates: vec![GateReq::new(qsconn_key(connection), Some(cap))],
        deadline,
        max_queue: QueueLimit::AtMost(queue_depth),
    };
    match table.acquire(request, now) {
        Acquire::Granted(p) => SlotAcquire::Slot(p),
        Acquire::Queued => SlotAcquire::Queued,
        Acquire::Rejected(_) => SlotAcquire::NoSlot,
    }
}

// ---------------------------------------------------------------------------------------
// §2.4 selectQuotaShareTarget
// ---------------------------------------------------------------------------------------

/// One candidate of a quota-share combo.
#[derive(Clone, Debug, PartialEq)]
pub struct QsTarget {
    /// `provider/model[/connection]`: the DRR state's key.
    pub execution_key: String,
    pub connection: Option<ConnectionId>,
    /// Missing, ≤ 0 or non-finite counts as 1.
    pub weight: Option<f64>,
}

/// Whether a connection is saturated in a quota bucket (`5h`, `7d`, `7d:<bareModel>`).
pub trait BucketSaturation {
    fn is_saturated(&self, connection: ConnectionId, bucket: &str) -> bool;
}

impl<F: Fn(ConnectionId, &str) -> bool> BucketSaturation for F {
    fn is_saturated(&self, connection: ConnectionId, bucket: &str) -> bool {
        self(connection, bucket)
    }
}

/// No bucket is ever saturated.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoBuckets;

impl BucketSaturation for NoBuckets {
    fn is_saturated(&self, _: ConnectionId, _: &str) -> bool {
        false
    }
}

/// A counted in-flight request on a connection. Not `Clone`: handing it to
/// [`QuotaShareSelector::release`] consumes it, so it is released at most once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an in-flight ticket must be released"]
pub struct InflightTicket {
    connection: ConnectionId,
    serial: u64,
}

impl InflightTicket {
    /// Unique among this selector's tickets (names it in a release message).
    pub fn serial(&self) -> u64 {
        self.serial
    }
}

/// The result of [`QuotaShareSelector::select`]; indices point into the input targets.
#[derive(Debug, PartialEq)]
pub struct Selection {
    /// `None` only for an empty input.
    pub target: Option<usize>,
    /// Chosen, remaining with-room targets, at-cap tail, saturated tail.
    pub ordered: Vec<usize>,
    /// The chosen target's in-flight count (`None` when it has no connection).
    pub ticket: Option<InflightTicket>,
}

/// The state behind `selectQuotaShareTarget` on one owner shard.
#[derive(Debug, Default)]
pub struct QuotaShareSelector {
    /// Combo name → execution key → deficit.
    deficits: HashMap<String, HashMap<String, f64>>,
    /// Combo names in insertion order, for eviction.
    combos: VecDeque<String>,
    /// Connection → live tickets (serial → lease end, mono ns).
    inflight: HashMap<ConnectionId, BTreeMap<u64, u64>>,
    next_serial: u64,
}

fn effective_weight(w: Option<f64>) -> f64 {
    match w {
        Some(w) if w.is_finite() && w > 0.0 => w,
        _ => 1.0,
    }
}

fn bare_model(model: &str) -> &str {
    model.split_once('/').map_or(model, |(_, rest)| rest)
}

impl QuotaShareSelector {
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// Live in-flight requests on `connection` at `now`.
    pub fn in_flight(&self, connection: ConnectionId, now: Now) -> u32 {
        self.inflight.get(&connection).map_or(0, |t| {
            u32::try_from(t.values().filter(|end| **end > now.mono_ns).count()).unwrap_or(u32::MAX)
        })
    }

    /// A deficit, for tests and the admin view.
    #[cfg(test)]
    pub fn deficit(&self, combo: &str, execution_key: &str) -> Option<f64> {
        self.deficits.get(combo)?.get(execution_key).copied()
    }

    /// Picks the target for one quota-share dispatch (§2.4) and counts it in flight.
    pub fn select(
        &mut self,
        targets: &[QsTarget],
        combo: &str,
        model: &str,
        caps: Option<&HashMap<ConnectionId, u32>>,
        buckets: &impl BucketSaturation,
        now: Now,
    ) -> Selection {
        if targets.is_empty() {
            return Selection {
                target: None,
                ordered: Vec::new(),
                ticket: None,
            };
        }
        // 1. bucket gate
        let model_bucket = format!("7d:{}", bare_model(model));
        let saturated = |t: &QsTarget| {
            t.connection.is_some_and(|c| {
                buckets.is_saturated(c, "5h")
                    || buckets.is_saturated(c, "7d")
                    || buckets.is_saturated(c, &model_bucket)
            })
        };
        let (mut open, mut saturated_tail): (Vec<usize>, Vec<usize>) =
            (0..targets.len()).partition(|i| !saturated(&targets[*i]));
        if open.is_empty() {
            open = std::mem::take(&mut saturated_tail);
        }
        // 2. cap gate
        let mut at_cap = Vec::new();
        if let Some(caps) = caps.filter(|c| !c.is_empty()) {
            let full = |i: &usize| {
                targets[*i].connection.is_some_and(|c| {
                    caps.get(&c)
                        .is_some_and(|cap| *cap > 0 && self.in_flight(c, now) >= *cap)
                })
            };
            let (room, capped): (Vec<usize>, Vec<usize>) =
                open.iter().copied().partition(|i| !full(i));
            if !room.is_empty() {
                open = room;
                at_cap = capped;
            }
        }
        // 3. deficit round robin
        let mut list = open;
        if list.len() > 1 {
            let winner = self.drr(targets, &list, combo);
            list.retain(|i| *i != winner);
            list.insert(0, winner);
        }
        // 4. power of two choices
        if list.len() > 1 {
            let load = |i: usize| targets[i].connection.map_or(0, |c| self.in_flight(c, now));
            if load(list[1]) < load(list[0]) {
                list.swap(0, 1);
            }
        }
        // 5. count the chosen target in flight
        let chosen = list[0];
        let ticket = targets[chosen].connection.map(|connection| {
            let serial = self.next_serial;
            self.next_serial += 1;
            let end = now
                .mono_ns
                .saturating_add(INFLIGHT_LEASE_MS.saturating_mul(1_000_000));
            self.inflight
                .entry(connection)
                .or_default()
                .insert(serial, end);
            InflightTicket { connection, serial }
        });
        // 6. order
        list.extend(at_cap);
        list.extend(saturated_tail);
        Selection {
            target: Some(chosen),
            ordered: list,
            ticket,
        }
    }

    /// Ends an in-flight request (once, by type; a ticket whose lease ran out is a no-op).
    pub fn release(&mut self, ticket: InflightTicket) {
        if let Some(t) = self.inflight.get_mut(&ticket.connection) {
            t.remove(&ticket.serial);
            if t.is_empty() {
                self.inflight.remove(&ticket.connection);
            }
        }
    }

    /// Drops leases that ran out (call now and then; counting ignores them already).
    pub fn sweep(&mut self, now: Now) {
        self.inflight.retain(|_, t| {
            t.retain(|_, end| *end > now.mono_ns);
            !t.is_empty()
        });
    }

    /// Charges one DRR round over `candidates` (≥ 2) and returns the winner's index.
    fn drr(&mut self, targets: &[QsTarget], candidates: &[usize], combo: &str) -> usize {
        if !self.deficits.contains_key(combo) {
            if self.combos.len() >= MAX_DRR_COMBOS
                && let Some(oldest) = self.combos.pop_front()
            {
                self.deficits.remove(&oldest);
            }
            self.combos.push_back(combo.to_owned());
        }
        let state = self.deficits.entry(combo.to_owned()).or_default();
        let total: f64 = candidates
            .iter()
            .map(|i| effective_weight(targets[*i].weight))
            .sum();
        let mut best: Option<(usize, f64)> = None;
        for &i in candidates {
            let t = &targets[i];
            let d = state.entry(t.execution_key.clone()).or_insert(0.0);
            *d += effective_weight(t.weight) / total;
            if best.is_none_or(|(_, b)| *d > b) {
                best = Some((i, *d));
            }
        }
        let winner = best.map_or(candidates[0], |(i, _)| i);
        if let Some(d) = state.get_mut(&targets[winner].execution_key) {
            *d -= 1.0;
        }
        winner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Now {
        Now {
            mono_ns: ms * 1_000_000,
            wall_ms: 1_700_000_000_000 + ms,
        }
    }

    fn target(key: &str, conn: u32, weight: f64) -> QsTarget {
        QsTarget {
            execution_key: key.to_owned(),
            connection: Some(ConnectionId(conn)),
            weight: Some(weight),
        }
    }

    fn ab() -> Vec<QsTarget> {
        vec![target("p/m/a", 1, 3.0), target("p/m/b", 2, 1.0)]
    }

    fn pick(
        s: &mut QuotaShareSelector,
        targets: &[QsTarget],
        now: Now,
    ) -> (usize, Option<InflightTicket>) {
        let sel = s.select(targets, "combo", "p/m", None, &NoBuckets, now);
        (sel.target.unwrap(), sel.ticket)
    }

    #[test]
    fn worked_example_with_releases() {
        let mut s = QuotaShareSelector::new();
        let t = ab();
        let mut seq = Vec::new();
        let expected_deficits = [(-0.25, 0.25), (-0.5, 0.5), (0.25, -0.25), (0.0, 0.0)];
        for (n, (da, db)) in expected_deficits.iter().enumerate() {
            let (i, ticket) = pick(&mut s, &t, at(n as u64));
            seq.push(i);
            assert_eq!(s.deficit("combo", "p/m/a"), Some(*da), "pick {n}");
            assert_eq!(s.deficit("combo", "p/m/b"), Some(*db), "pick {n}");
            s.release(ticket.unwrap());
        }
        assert_eq!(seq, vec![0, 0, 1, 0]);
    }

    #[test]
    fn weights_3_to_1_split_exactly_300_100() {
        let mut s = QuotaShareSelector::new();
        let t = ab();
        let mut counts = [0usize; 2];
        for n in 0..400 {
            let (i, ticket) = pick(&mut s, &t, at(n));
            counts[i] += 1;
            s.release(ticket.unwrap());
        }
        assert_eq!(counts, [300, 100]);
    }

    #[test]
    fn p2c_prefers_the_less_loaded_without_releases() {
        let mut s = QuotaShareSelector::new();
        let t = ab();
        let (first, _t1) = pick(&mut s, &t, at(0));
        assert_eq!(first, 0);
        let sel = s.select(&t, "combo", "p/m", None, &NoBuckets, at(1));
        // DRR picked A again (tie at .5), but A has 1 in flight and B none.
        assert_eq!(sel.target, Some(1));
        assert_eq!(sel.ordered, vec![1, 0]);
        assert_eq!(
            s.deficit("combo", "p/m/a"),
            Some(-0.5),
            "the winner's charge is not refunded"
        );
        assert_eq!(s.in_flight(ConnectionId(2), at(1)), 1);
    }

    #[test]
    fn bucket_and_cap_gates_order_the_tails() {
        let mut s = QuotaShareSelector::new();
        let t = vec![
            target("k0", 1, 1.0),
            target("k1", 2, 1.0),
            target("k2", 3, 1.0),
            QsTarget {
                execution_key: "k3".into(),
                connection: None,
                weight: None,
            },
        ];
        let model_saturated = |c: ConnectionId, b: &str| c == ConnectionId(1) && b == "7d:m";
        let caps: HashMap<ConnectionId, u32> = [(ConnectionId(2), 1)].into_iter().collect();
        let _held = s
            .select(&t[1..2], "other", "p/m", None, &NoBuckets, at(0))
            .ticket;
        assert_eq!(s.in_flight(ConnectionId(2), at(0)), 1);
        let sel = s.select(&t, "c", "p/m", Some(&caps), &model_saturated, at(1));
        // Saturated: k0. At cap: k1. With room: k2, k3 (DRR tie → k2).
        assert_eq!(sel.target, Some(2));
        assert_eq!(sel.ordered, vec![2, 3, 1, 0]);
        // Everything saturated: fail open, nothing moves.
        let all = |_: ConnectionId, _: &str| true;
        let sel = s.select(&t[..3], "d", "p/m", None, &all, at(2));
        assert_eq!(sel.ordered.len(), 3);
        assert_eq!(sel.target, Some(0));
    }

    #[test]
    fn empty_single_and_eviction() {
        let mut s = QuotaShareSelector::new();
        let sel = s.select(&[], "c", "p/m", None, &NoBuckets, at(0));
        assert_eq!(
            sel,
            Selection {
                target: None,
                ordered: vec![],
                ticket: None
            }
        );
        let one = [target("only", 1, 2.0)];
        let sel = s.select(&one, "c", "p/m", None, &NoBuckets, at(0));
        assert_eq!(sel.target, Some(0));
        assert_eq!(
            s.deficit("c", "only"),
            None,
            "a single candidate leaves the state untouched"
        );
        s.release(sel.ticket.unwrap());
        for n in 0..=MAX_DRR_COMBOS {
            let sel = s.select(&ab(), &format!("c{n}"), "p/m", None, &NoBuckets, at(0));
            s.release(sel.ticket.unwrap());
        }
        assert_eq!(
            s.deficit("c0", "p/m/a"),
            None,
            "the oldest combo was evicted"
        );
        assert!(s.deficit(&format!("c{MAX_DRR_COMBOS}"), "p/m/a").is_some());
        assert_eq!(s.in_flight(ConnectionId(1), at(0)), 0);
    }

    #[test]
    fn leases_expire() {
        let mut s = QuotaShareSelector::new();
        let (_, ticket) = pick(&mut s, &ab(), at(0));
        assert_eq!(s.in_flight(ConnectionId(1), at(INFLIGHT_LEASE_MS - 1)), 1);
        assert_eq!(s.in_flight(ConnectionId(1), at(INFLIGHT_LEASE_MS)), 0);
        s.sweep(at(INFLIGHT_LEASE_MS));
        s.release(ticket.unwrap());
        assert_eq!(s.in_flight(ConnectionId(1), at(0)), 0);
    }

    #[test]
    fn qsconn_slot_serializes_and_fails_open() {
        let mut g = GateTable::new();
        let r = |id, conn: Option<u32>, cap, depth| SlotRequest {
            id,
            connection: conn.map(ConnectionId),
            max_concurrent: cap,
            deadline: Some(QS_QUEUE_TIMEOUT_MS * 1_000_000),
            queue_depth: depth,
        };
        let first = match acquire_slot(&mut g, true, r(1, Some(7), Some(1), QS_QUEUE_DEPTH), at(0))
        {
            SlotAcquire::Slot(p) => p,
            other => panic!("{other:?}"),
        };
        assert_eq!(first.keys(), &[qsconn_key(ConnectionId(7))]);
        assert_eq!(
            acquire_slot(&mut g, true, r(2, Some(7), Some(1), QS_QUEUE_DEPTH), at(1)),
            SlotAcquire::Queued
        );
        // Another connection does not interact.
        assert!(matches!(
            acquire_slot(&mut g, true, r(3, Some(8), Some(1), 20), at(1)),
            SlotAcquire::Slot(_)
        ));
        // Queue depth 0 and busy: proceed without a slot at once.
        assert_eq!(
            acquire_slot(&mut g, true, r(4, Some(7), Some(1), 0), at(1)),
            SlotAcquire::NoSlot
        );
        // Disabled, no connection, no cap: no slot.
        assert_eq!(
            acquire_slot(&mut g, false, r(5, Some(7), Some(1), 20), at(1)),
            SlotAcquire::NoSlot
        );
        assert_eq!(
            acquire_slot(&mut g, true, r(6, None, Some(1), 20), at(1)),
            SlotAcquire::NoSlot
        );
        assert_eq!(
            acquire_slot(&mut g, true, r(7, Some(9), Some(0), 20), at(1)),
            SlotAcquire::NoSlot
        );
        let w = g.release(first, at(2));
        assert_eq!(
            w.granted.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![2]
        );
        // A queued slot that times out means "proceed without one" to the owner.
        let held = w.granted.into_iter().map(|(_, p)| p).next().unwrap();
        assert_eq!(
            acquire_slot(&mut g, true, r(10, Some(7), Some(1), 20), at(3)),
            SlotAcquire::Queued
        );
        let w = g.expire(at(QS_QUEUE_TIMEOUT_MS));
        assert_eq!(w.len(), 1);
        let _ = g.release(held, at(QS_QUEUE_TIMEOUT_MS));
    }
}
