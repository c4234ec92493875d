//! A seeded, deterministic simulation of the owner/view protocol over the real mesh.
//!
//! One thread drives N = 1..8 shards' [`MeshEnd`]s directly (no runtime, no sleeping): a
//! [`ManualClock`] advances by a random step each tick, random shards send failure events
//! about random keys to the keys' owners (`owner(hash, n)` of a random hash), owners feed a
//! toy breaker ("opens after K failures, closes at its deadline, a failure while open extends
//! the deadline within the same epoch") and broadcast [`ViewUpdate`]s to every shard, and
//! every shard merges them into its [`ViewTable`]. Rings are tiny (1..16 slots) and drained
//! with random budgets, so real ring-full drops happen; on top of the mesh, view broadcasts
//! are randomly lost, duplicated and delayed (reordered) before they are applied. Owners
//! re-broadcast one owned key per round (anti-entropy), which is what repairs lost updates.
//!
//! Checked on every tick, for every key, shard and pair of shards:
//! - (a) the owner's failure count equals the events that were sent and not handed back;
//! - every message a ring took comes out of it exactly once, and the mesh's drop counters
//!   equal the sends the simulation saw handed back, pair by pair;
//! - (c) a view's epoch never goes down, and a view is never ahead of its owner;
//!
//! and, after a quiescent period (no new events, no loss; duplicates, reordering and
//! ring-full drops continue), (b) every shard's view equals its owner's state.
//!
//! A failure names its seed and shard count; rerun one case with
//! `MESH_SIM_SEED=<seed> MESH_SIM_SHARDS=<n> cargo test --test mesh_simulation`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

use tidegate::clock::{Clock, ManualClock};
use tidegate::runtime::mesh::{DropReason, Mesh, MeshEnd};
use tidegate::runtime::owner::owner;
use tidegate::runtime::view::{ViewEntry, ViewState, ViewTable, ViewUpdate};

/// Seeds per shard count in the sweep.
const SEEDS_PER_SIZE: u64 = 16;
/// Ticks with failure events and lossy delivery.
const ACTIVE_TICKS: u64 = 300;
/// Send/drain rounds per tick.
const ROUNDS_PER_TICK: u64 = 3;

/// xorshift64* — tiny, seedable, good enough to pick events.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let s = (seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        Rng(if s == 0 { 1 } else { s })
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n == 0`).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    fn range(&mut self, lo: u64, hi_inclusive: u64) -> u64 {
        lo + self.below(hi_inclusive - lo + 1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Why {
    TooManyFailures,
}

type Key = u32;

#[derive(Clone, Debug)]
enum Msg {
    /// A fact for the key's owner: one more failure.
    Failure { key: Key },
    /// An owner's broadcast.
    View(ViewUpdate<Key, Why>),
}

/// The toy mechanism an owner runs per key.
#[derive(Clone, Debug, Default)]
struct Toy {
    failures: u64,
    streak: u64,
    open_until_ns: Option<u64>,
    epoch: u64,
}

impl Toy {
    fn state(&self) -> ViewState<Why> {
        match self.open_until_ns {
            Some(until_ns) => ViewState::Blocked {
                until_ns,
                why: Why::TooManyFailures,
            },
            None => ViewState::Routable,
        }
    }

    /// Records a failure; `true` if the state changed (and must be broadcast).
    fn on_failure(&mut self, now_ns: u64, trip_after: u64, cooldown_ns: u64) -> bool {
        self.failures += 1;
        let deadline = now_ns + cooldown_ns;
        match self.open_until_ns {
            // Open: a failure pushes the deadline out, within the same epoch.
            Some(until) if deadline > until => {
                self.open_until_ns = Some(deadline);
                true
            }
            Some(_) => false,
            None => {
                self.streak += 1;
                if self.streak < trip_after {
                    return false;
                }
                self.streak = 0;
                self.open_until_ns = Some(deadline);
                self.epoch += 1;
                true
            }
        }
    }

    /// Closes at the deadline; `true` on that transition.
    fn on_tick(&mut self, now_ns: u64) -> bool {
        match self.open_until_ns {
            Some(until) if now_ns >= until => {
                self.open_until_ns = None;
                self.epoch += 1;
                true
            }
            Some(_) | None => false,
        }
    }

    fn entry(&self) -> ViewEntry<Why> {
        ViewEntry {
            epoch: self.epoch,
            state: self.state(),
        }
    }
}

/// Faults on view broadcasts, applied after the mesh delivered them.
#[derive(Clone, Copy, Debug)]
struct Faults {
    loss_percent: u64,
    dup_percent: u64,
    max_delay_ticks: u64,
}

struct Sim {
    seed: u64,
    n: usize,
    rng: Rng,
    clock: ManualClock,
    ends: Vec<MeshEnd<Msg>>,
    capacity: usize,
    trip_after: u64,
    cooldown_ns: u64,
    faults: Faults,
    /// Per key: the shard that owns it.
    owners: Vec<usize>,
    /// Per shard: the keys it owns, and where its anti-entropy sweep is.
    owned: Vec<Vec<Key>>,
    resync_cursor: Vec<usize>,
    /// Per key: the owner's toy state (only the owner's pump touches it; asserted).
    toys: Vec<Toy>,
    /// Per shard: its view table and the broadcasts waiting to be applied `(due_tick, update)`.
    views: Vec<ViewTable<Key, Why>>,
    delayed: Vec<Vec<(u64, ViewUpdate<Key, Why>)>>,
    /// Per key: failure events the mesh accepted.
    accepted: Vec<u64>,
    /// Per `from * n + to`: sends the mesh handed back, took, and delivered.
    handed_back: Vec<u64>,
    taken: Vec<u64>,
    delivered: Vec<u64>,
    /// Per shard, per key: the epoch its view showed at the end of the last tick.
    last_epochs: Vec<Vec<Option<u64>>>,
    tick: u64,
    lossy: bool,
    /// Counters for the determinism check and for the coverage assertions.
    trace: Trace,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Trace {
    events_sent: u64,
    events_handed_back: u64,
    views_handed_back: u64,
    views_lost: u64,
    views_duplicated: u64,
    views_applied_changed: u64,
    views_applied_ignored: u64,
    transitions: u64,
}

impl Sim {
    fn new(seed: u64, n: usize) -> Self {
        let mut rng = Rng::new(seed ^ ((n as u64) << 32));
        let capacity = 1usize << rng.below(5);
        let keys = rng.range(1, 40) as usize;
        let owners: Vec<usize> = (0..keys).map(|_| owner(rng.next(), n)).collect();
        let mut owned = vec![Vec::new(); n];
        for (key, &o) in owners.iter().enumerate() {
            owned[o].push(key as Key);
        }
        let faults = Faults {
            loss_percent: rng.range(0, 25),
            dup_percent: rng.range(0, 25),
            max_delay_ticks: rng.range(0, 3),
        };
        Sim {
            seed,
            n,
            capacity,
            trip_after: rng.range(1, 5),
            cooldown_ns: rng.range(50, 1_500) * 1_000_000,
            faults,
            clock: ManualClock::new(1_700_000_000_000),
            ends: Mesh::with_capacity(n, capacity),
            owners,
            owned,
            resync_cursor: vec![0; n],
            toys: vec![Toy::default(); keys],
            views: (0..n).map(|_| ViewTable::new()).collect(),
            delayed: vec![Vec::new(); n],
            accepted: vec![0; keys],
            handed_back: vec![0; n * n],
            taken: vec![0; n * n],
            delivered: vec![0; n * n],
            last_epochs: vec![vec![None; keys]; n],
            tick: 0,
            lossy: true,
            trace: Trace::default(),
            rng,
        }
    }

    fn ctx(&self) -> String {
        format!(
            "seed={} shards={} tick={} capacity={} faults={:?}",
            self.seed, self.n, self.tick, self.capacity, self.faults
        )
    }

    fn now_ns(&self) -> u64 {
        self.clock.now().mono_ns
    }

    fn send(&mut self, from: usize, to: usize, msg: Msg) -> bool {
        let is_event = matches!(msg, Msg::Failure { .. });
        match self.ends[from].send(to, msg) {
            Ok(()) => {
                self.taken[from * self.n + to] += 1;
                true
            }
            Err(_) => {
                self.handed_back[from * self.n + to] += 1;
                if is_event {
                    self.trace.events_handed_back += 1;
                } else {
                    self.trace.views_handed_back += 1;
                }
                false
            }
        }
    }

    /// Sends the owner's current state of `key` to every shard (itself included); `true` if
    /// every ring took it.
    fn broadcast(&mut self, from: usize, key: Key) -> bool {
        let toy = &self.toys[key as usize];
        let update = ViewUpdate {
            key,
            epoch: toy.epoch,
            state: toy.state(),
        };
        let mut all = true;
        for to in 0..self.n {
            all &= self.send(from, to, Msg::View(update.clone()));
        }
        all
    }

    fn handle(&mut self, at: usize, from: usize, msg: Msg) {
        match msg {
            Msg::Failure { key } => {
                assert_eq!(
                    self.owners[key as usize],
                    at,
                    "{}: an event reached a shard that does not own key {key}",
                    self.ctx()
                );
                let now = self.now_ns();
                let (trip, cooldown) = (self.trip_after, self.cooldown_ns);
                if self.toys[key as usize].on_failure(now, trip, cooldown) {
                    self.trace.transitions += 1;
                    // A drop here is repaired by the anti-entropy sweep.
                    let _ = self.broadcast(at, key);
                }
            }
            Msg::View(update) => {
                assert_eq!(
                    self.owners[update.key as usize],
                    from,
                    "{}: a view update for key {} came from a non-owner",
                    self.ctx(),
                    update.key
                );
                if self.lossy && self.rng.percent(self.faults.loss_percent) {
                    self.trace.views_lost += 1;
                    return;
                }
                let copies = if self.rng.percent(self.faults.dup_percent) {
                    self.trace.views_duplicated += 1;
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let due = self.tick + self.rng.below(self.faults.max_delay_ticks + 1);
                    self.delayed[at].push((due, update.clone()));
                }
            }
        }
    }

    /// Drains up to `budget` messages of shard `at`.
    fn drain(&mut self, at: usize, budget: u64) -> u64 {
        let mut taken = 0;
        while taken < budget {
            let Some((from, msg)) = self.ends[at].try_recv() else {
                break;
            };
            taken += 1;
            let pair = from * self.n + at;
            self.delivered[pair] += 1;
            assert!(
                self.delivered[pair] <= self.taken[pair],
                "{}: ring {from}->{at} delivered more messages than it took",
                self.ctx()
            );
            self.handle(at, from, msg);
        }
        taken
    }

    /// Applies shard `at`'s due broadcasts (all of them when `flush`), in a shuffled order.
    fn deliver(&mut self, at: usize, flush: bool) {
        let tick = self.tick;
        let pending = std::mem::take(&mut self.delayed[at]);
        let (mut due, later): (Vec<_>, Vec<_>) =
            pending.into_iter().partition(|(t, _)| flush || *t <= tick);
        self.delayed[at] = later;
        for i in (1..due.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            due.swap(i, j);
        }
        for (_, update) in due {
            let key = update.key;
            let before = self.views[at].get(&key).map(|e| e.epoch);
            if self.views[at].apply(update) {
                self.trace.views_applied_changed += 1;
            } else {
                self.trace.views_applied_ignored += 1;
            }
            let after = self.views[at].get(&key).cloned();
            let after = after.unwrap_or_else(|| panic!("{}: apply lost key {key}", self.ctx()));
            // (c) never backwards in epoch.
            assert!(
                Some(after.epoch) >= before,
                "{}: shard {at} view of key {key} went back from epoch {before:?} to {}",
                self.ctx(),
                after.epoch
            );
            // A view never runs ahead of its owner.
            let owner_entry = self.toys[key as usize].entry();
            assert!(
                (after.epoch, &after.state) <= (owner_entry.epoch, &owner_entry.state),
                "{}: shard {at} view of key {key} {after:?} is ahead of its owner {owner_entry:?}",
                self.ctx()
            );
        }
    }

    fn owners_tick(&mut self, at: usize) {
        let now = self.now_ns();
        for i in 0..self.owned[at].len() {
            let key = self.owned[at][i];
            if self.toys[key as usize].on_tick(now) {
                self.trace.transitions += 1;
                let _ = self.broadcast(at, key);
            }
        }
    }

    /// Anti-entropy: each owner re-broadcasts one owned key per round, moving on to the next
    /// key only once every ring has taken it (a real owner paces the sweep by ring space too).
    fn resync(&mut self, at: usize) {
        let owned = self.owned[at].len();
        if owned == 0 {
            return;
        }
        let key = self.owned[at][self.resync_cursor[at] % owned];
        if self.broadcast(at, key) {
            self.resync_cursor[at] = (self.resync_cursor[at] + 1) % owned;
        }
    }

    fn step(&mut self, events: bool) {
        self.tick += 1;
        self.clock.advance_ms(self.rng.range(1, 50));
        for _ in 0..ROUNDS_PER_TICK {
            if events {
                let burst = self.rng.below(3 * self.n as u64 + 5);
                for _ in 0..burst {
                    let from = self.rng.below(self.n as u64) as usize;
                    let key = self.rng.below(self.toys.len() as u64) as Key;
                    let to = self.owners[key as usize];
                    self.trace.events_sent += 1;
                    if self.send(from, to, Msg::Failure { key }) {
                        self.accepted[key as usize] += 1;
                    }
                }
            }
            for at in 0..self.n {
                let budget = self.rng.below(2 * self.capacity as u64 + 2);
                self.drain(at, budget);
                self.owners_tick(at);
                self.resync(at);
                self.deliver(at, false);
            }
        }
        // End of tick: empty every ring (handling can send more; loop until quiet), so the
        // owners' counts can be compared exactly.
        while (0..self.n).map(|at| self.drain(at, u64::MAX)).sum::<u64>() > 0 {}
        for at in 0..self.n {
            self.deliver(at, false);
        }
        self.check_tick();
    }

    fn check_tick(&mut self) {
        // (a) every accepted event was counted by its owner, exactly once.
        for (key, toy) in self.toys.iter().enumerate() {
            assert_eq!(
                toy.failures,
                self.accepted[key],
                "{}: owner of key {key} counted {} failures, {} were sent and not dropped",
                self.ctx(),
                toy.failures,
                self.accepted[key]
            );
        }
        // The mesh's counters agree with what the senders saw, pair by pair, and every
        // message a ring took has come out of it (rings are empty at the end of a tick).
        let stats = self.ends[0].stats().clone();
        for from in 0..self.n {
            for to in 0..self.n {
                let pair = from * self.n + to;
                assert_eq!(
                    self.delivered[pair],
                    self.taken[pair],
                    "{}: ring {from}->{to} lost messages",
                    self.ctx()
                );
                assert_eq!(
                    stats.pair(from, to).ring_full,
                    self.handed_back[from * self.n + to],
                    "{}: drop counter {from}->{to}",
                    self.ctx()
                );
            }
        }
        assert_eq!(stats.total(DropReason::PeerClosed), 0, "{}", self.ctx());
        assert_eq!(stats.total(DropReason::NoSuchShard), 0, "{}", self.ctx());
        // (c) across ticks as well.
        for at in 0..self.n {
            for key in 0..self.toys.len() {
                let now = self.views[at].get(&(key as Key)).map(|e| e.epoch);
                assert!(
                    now >= self.last_epochs[at][key],
                    "{}: shard {at} key {key} epoch went from {:?} to {now:?}",
                    self.ctx(),
                    self.last_epochs[at][key]
                );
                self.last_epochs[at][key] = now;
            }
        }
    }

    fn run(&mut self) -> Trace {
        for _ in 0..ACTIVE_TICKS {
            self.step(true);
        }
        // Quiescence: no new events, the network stops losing (it still duplicates and
        // reorders, and rings still fill). Wait out every deadline, then let anti-entropy sweep:
        // each tick starts with empty rings, so each owner's first resync of a tick always
        // lands, and one sweep takes at most `owned` ticks; three sweeps leave a wide margin.
        self.lossy = false;
        let last_deadline = self
            .toys
            .iter()
            .filter_map(|t| t.open_until_ns)
            .max()
            .unwrap_or(0);
        while self.now_ns() <= last_deadline {
            self.step(false);
        }
        let sweep = self.owned.iter().map(Vec::len).max().unwrap_or(0) as u64;
        for _ in 0..3 * sweep + 2 {
            self.step(false);
        }
        for at in 0..self.n {
            self.deliver(at, true);
        }
        // (b) every view equals its owner's state, and routing agrees.
        let now = self.clock.now();
        for at in 0..self.n {
            for (key, toy) in self.toys.iter().enumerate() {
                let key = key as Key;
                assert_eq!(
                    self.views[at].get(&key),
                    Some(&toy.entry()),
                    "{}: shard {at} did not converge on key {key}",
                    self.ctx()
                );
                assert_eq!(
                    self.views[at].is_routable(&key, now),
                    toy.open_until_ns.is_none_or(|u| u <= now.mono_ns),
                    "{}: shard {at} routes key {key} differently from its owner",
                    self.ctx()
                );
            }
        }
        self.trace.clone()
    }
}

/// Runs one case; on failure, says how to rerun it before failing.
fn run_case(seed: u64, n: usize) -> Trace {
    match std::panic::catch_unwind(|| Sim::new(seed, n).run()) {
        Ok(trace) => trace,
        Err(panic) => {
            eprintln!(
                "mesh simulation failed: seed={seed} shards={n}; rerun with \
                 MESH_SIM_SEED={seed} MESH_SIM_SHARDS={n} cargo test --test mesh_simulation"
            );
            std::panic::resume_unwind(panic)
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn views_converge_and_counts_hold_across_seeds_and_shard_counts() {
    if let (Some(seed), Some(n)) = (env_u64("MESH_SIM_SEED"), env_u64("MESH_SIM_SHARDS")) {
        run_case(seed, n as usize);
        return;
    }
    let mut total = Trace::default();
    for n in 1..=8 {
        for seed in 0..SEEDS_PER_SIZE {
            let t = run_case(seed, n);
            total.events_sent += t.events_sent;
            total.events_handed_back += t.events_handed_back;
            total.views_handed_back += t.views_handed_back;
            total.views_lost += t.views_lost;
            total.views_duplicated += t.views_duplicated;
            total.views_applied_changed += t.views_applied_changed;
            total.views_applied_ignored += t.views_applied_ignored;
            total.transitions += t.transitions;
        }
    }
    // The sweep must actually exercise every fault it claims to survive.
    assert!(
        total.events_handed_back > 0,
        "no event was ever dropped: {total:?}"
    );
    assert!(
        total.views_handed_back > 0,
        "no broadcast was ever dropped: {total:?}"
    );
    assert!(total.views_lost > 0, "{total:?}");
    assert!(total.views_duplicated > 0, "{total:?}");
    assert!(total.views_applied_ignored > 0, "{total:?}");
    assert!(total.transitions > 0, "{total:?}");
}

#[test]
fn one_shard_runs_the_same_protocol_through_its_local_queue() {
    for seed in 0..SEEDS_PER_SIZE {
        let t = run_case(1_000 + seed, 1);
        assert!(t.events_sent > 0);
    }
}

#[test]
fn the_same_seed_replays_the_same_run() {
    for n in [1, 3, 8] {
        assert_eq!(run_case(42, n), run_case(42, n), "shards={n}");
    }
}
