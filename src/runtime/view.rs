//! Views: each shard's local replica of what owners decided — for every key, "routable, or
//! not until T, and why", stamped with the owner's per-key epoch (ARCHITECTURE.md §1.2, §3).
//!
//! Routing reads only its shard's [`ViewTable`], so the happy path crosses no core. Owners
//! broadcast a [`ViewUpdate`] on every transition over the mesh, and the mesh may drop
//! (ring full), and a transport may duplicate or reorder; so [`ViewTable::apply`] is a
//! *join*: the table keeps, per key, the greatest update it has seen under a total order —
//! the epoch first, then the state ([`ViewState::Routable`] below any
//! [`ViewState::Blocked`], blocked states by `until_ns`, then by `why`). Taking a maximum is
//! idempotent, commutative and associative, so:
//!
//! - an update with an older epoch is ignored;
//! - at an equal epoch the later `until` wins (an owner may extend a deadline without a new
//!   epoch);
//! - a duplicate is a no-op (`apply` returns `false`);
//! - any reordering of the same set of updates ends in the same table, and a view never goes
//!   back in epoch.
//!
//! The owner's side of the contract: bump the key's epoch on every transition (blocked →
//! routable, routable → blocked, a change of `why`), and within one epoch only ever extend
//! `until_ns`. A dropped broadcast only delays convergence, so owners re-broadcast their
//! current state from time to time (anti-entropy); `tests/mesh_simulation.rs` checks that
//! this converges under drops, duplicates and reordering.
//!
//! Deadlines are monotonic nanoseconds ([`Now::mono_ns`]): every shard of a process shares
//! the process epoch, so they compare across shards. `until_ns = u64::MAX` means "until
//! further notice" (a terminal state). An expired block reads as routable even before the
//! owner's next broadcast arrives; whatever happens then (a half-open probe) is the owner's
//! decision at admission.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::Hash;

use crate::clock::Now;
use crate::runtime::owner::FnvBuildHasher;

/// What an owner says about a key. Variant and field order define the merge order at equal
/// epochs (derive order: `Routable` < `Blocked`, then `until_ns`, then `why`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViewState<W> {
    Routable,
    Blocked {
        /// Monotonic deadline (ns since the process epoch); `u64::MAX` = until further notice.
        until_ns: u64,
        why: W,
    },
}

/// What a view holds for one key: the owner's epoch and state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewEntry<W> {
    pub epoch: u64,
    pub state: ViewState<W>,
}

impl<W: Ord> ViewEntry<W> {
    /// Whether `self` wins the merge against `other` (strictly greater in the view order).
    pub fn supersedes(&self, other: &Self) -> bool {
        (self.epoch, &self.state) > (other.epoch, &other.state)
    }
}

/// One broadcast from a key's owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewUpdate<K, W> {
    pub key: K,
    pub epoch: u64,
    pub state: ViewState<W>,
}

/// The answer routing gets for one key at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict<'a, W> {
    Routable,
    Blocked { until_ns: u64, why: &'a W },
}

/// A shard's replica of owner state, keyed by `K` (a provider id, a connection id, …),
/// explained by `W` (a small reason enum or payload).
#[derive(Clone, Debug)]
pub struct ViewTable<K, W> {
    entries: HashMap<K, ViewEntry<W>, FnvBuildHasher>,
}

impl<K, W> Default for ViewTable<K, W> {
    fn default() -> Self {
        Self {
            entries: HashMap::default(),
        }
    }
}

impl<K: Eq + Hash, W: Ord> ViewTable<K, W> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Merges one owner broadcast; `true` if the table changed. Older epochs, duplicates and
    /// equal-epoch updates with an earlier (or equal) `until` are ignored.
    pub fn apply(&mut self, update: ViewUpdate<K, W>) -> bool {
        let ViewUpdate { key, epoch, state } = update;
        let incoming = ViewEntry { epoch, state };
        match self.entries.entry(key) {
            Entry::Vacant(v) => {
                v.insert(incoming);
                true
            }
            Entry::Occupied(mut o) => {
                if incoming.supersedes(o.get()) {
                    o.insert(incoming);
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Whether `key` may be routed to at `now`. Unknown keys are routable (owners broadcast
    /// only transitions away from the default); a block whose deadline has passed is too.
    pub fn verdict(&self, key: &K, now: Now) -> Verdict<'_, W> {
        match self.entries.get(key) {
            Some(ViewEntry {
                state: ViewState::Blocked { until_ns, why },
                ..
            }) if *until_ns > now.mono_ns => Verdict::Blocked {
                until_ns: *until_ns,
                why,
            },
            Some(_) | None => Verdict::Routable,
        }
    }

    /// Shorthand for `verdict(key, now) == Verdict::Routable`.
    pub fn is_routable(&self, key: &K, now: Now) -> bool {
        matches!(self.verdict(key, now), Verdict::Routable)
    }

    /// The entry for `key`, if an owner ever broadcast one.
    pub fn get(&self, key: &K) -> Option<&ViewEntry<W>> {
        self.entries.get(key)
    }

    /// Every entry, in no particular order (for health pages).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &ViewEntry<W>)> {
        self.entries.iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    enum Why {
        BreakerOpen,
        Cooldown,
        Terminal,
    }

    fn blocked(key: u32, epoch: u64, until_ns: u64, why: Why) -> ViewUpdate<u32, Why> {
        ViewUpdate {
            key,
            epoch,
            state: ViewState::Blocked { until_ns, why },
        }
    }

    fn routable(key: u32, epoch: u64) -> ViewUpdate<u32, Why> {
        ViewUpdate {
            key,
            epoch,
            state: ViewState::Routable,
        }
    }

    fn at(mono_ns: u64) -> Now {
        Now {
            mono_ns,
            wall_ms: 0,
        }
    }

    #[test]
    fn unknown_keys_are_routable() {
        let t = ViewTable::<u32, Why>::new();
        assert_eq!(t.verdict(&1, at(0)), Verdict::Routable);
        assert!(t.is_empty());
    }

    #[test]
    fn a_block_holds_until_its_deadline() {
        let mut t = ViewTable::new();
        assert!(t.apply(blocked(1, 1, 100, Why::BreakerOpen)));
        assert_eq!(
            t.verdict(&1, at(99)),
            Verdict::Blocked {
                until_ns: 100,
                why: &Why::BreakerOpen
            }
        );
        assert!(t.is_routable(&1, at(100)));
        assert!(t.is_routable(&2, at(50)));
        assert!(t.apply(blocked(3, 1, u64::MAX, Why::Terminal)));
        assert!(!t.is_routable(&3, at(u64::MAX - 1)));
    }

    #[test]
    fn older_epochs_are_ignored() {
        let mut t = ViewTable::new();
        assert!(t.apply(routable(1, 5)));
        assert!(!t.apply(blocked(1, 4, 1_000, Why::Cooldown)));
        assert_eq!(t.get(&1).map(|e| e.epoch), Some(5));
        assert!(t.apply(blocked(1, 6, 1_000, Why::Cooldown)));
        assert!(t.apply(routable(1, 7)));
        assert!(t.is_routable(&1, at(0)));
    }

    #[test]
    fn equal_epochs_keep_the_later_until() {
        let mut t = ViewTable::new();
        assert!(t.apply(blocked(1, 3, 200, Why::Cooldown)));
        assert!(!t.apply(blocked(1, 3, 150, Why::Cooldown)));
        assert!(t.apply(blocked(1, 3, 300, Why::Cooldown)));
        assert!(!t.apply(routable(1, 3)));
        assert_eq!(
            t.get(&1).map(|e| e.state.clone()),
            Some(ViewState::Blocked {
                until_ns: 300,
                why: Why::Cooldown
            })
        );
    }

    #[test]
    fn duplicates_are_no_ops() {
        let mut t = ViewTable::new();
        let u = blocked(9, 2, 10, Why::BreakerOpen);
        assert!(t.apply(u.clone()));
        assert!(!t.apply(u.clone()));
        assert!(!t.apply(u));
        assert_eq!(t.len(), 1);
    }

    fn arb_update() -> impl Strategy<Value = ViewUpdate<u32, Why>> {
        let why = prop_oneof![
            Just(Why::BreakerOpen),
            Just(Why::Cooldown),
            Just(Why::Terminal)
        ];
        let state = prop_oneof![
            Just(ViewState::Routable),
            (0u64..50, why).prop_map(|(until_ns, why)| ViewState::Blocked { until_ns, why }),
        ];
        (0u32..4, 0u64..6, state).prop_map(|(key, epoch, state)| ViewUpdate { key, epoch, state })
    }

    fn snapshot(t: &ViewTable<u32, Why>) -> Vec<(u32, ViewEntry<Why>)> {
        let mut v: Vec<_> = t.iter().map(|(k, e)| (*k, e.clone())).collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any order, with any duplicates, ends in the same table: per key, the maximum update.
        #[test]
        fn reordering_and_duplication_converge(
            (updates, shuffled) in proptest::collection::vec(arb_update(), 0..40)
                .prop_flat_map(|u| {
                    let mut with_dups = u.clone();
                    with_dups.extend(u.iter().take(u.len() / 2).cloned());
                    (Just(u), Just(with_dups).prop_shuffle())
                })
        ) {
            let mut a = ViewTable::new();
            for u in updates.iter().cloned() {
                a.apply(u);
            }
            let mut b = ViewTable::new();
            for u in shuffled {
                b.apply(u);
            }
            prop_assert_eq!(snapshot(&a), snapshot(&b));
            for (key, entry) in snapshot(&a) {
                let max = updates
                    .iter()
                    .filter(|u| u.key == key)
                    .map(|u| (u.epoch, u.state.clone()))
                    .max();
                prop_assert_eq!(Some((entry.epoch, entry.state)), max);
            }
        }

        /// `apply` reports exactly whether the table changed; applying the same update again
        /// never changes it; a key's epoch never goes down.
        #[test]
        fn apply_is_idempotent_and_monotone(updates in proptest::collection::vec(arb_update(), 0..60)) {
            let mut t = ViewTable::new();
            for u in updates {
                let before = snapshot(&t);
                let old = t.get(&u.key).cloned();
                let changed = t.apply(u.clone());
                prop_assert_eq!(changed, snapshot(&t) != before);
                let new = t.get(&u.key).cloned();
                if let (Some(old), Some(new)) = (&old, &new) {
                    prop_assert!(new.epoch >= old.epoch);
                    prop_assert!(!old.supersedes(new));
                }
                let after = snapshot(&t);
                prop_assert!(!t.apply(u));
                prop_assert_eq!(snapshot(&t), after);
            }
        }
    }
}
