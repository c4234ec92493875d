//! Combo ordering strategies (spec B §3.2): the order in which one request tries a combo's
//! eligible targets. Pure: no I/O, no clock reads (the caller passes `now_ms`), randomness
//! from an [`Rng`] the caller owns. The proxy hands in the targets the local views let
//! through now (the pre-dispatch filters of B §3.1), each as a [`Step`]; an ordering is a
//! permutation of their positions.
//!
//! State is per combo ([`ComboState`]) and per shard ([`Strategies`], the shard's private
//! table): with several shards each rotates, draws and counts on its own. A combo whose
//! strategy or targets changed (a reload) starts again from fresh state.

use crate::config::{Combo, ComboStrategy, ConnectionId};

/// Half-life of the `least-used` usage counts: an attempt counts 1 when made, ½ a minute
/// later, ¼ two minutes later.
pub const LEAST_USED_HALF_LIFE_MS: u64 = 60_000;

/// Half-life of the `p2c` outcome records: an attempt's outcome weighs 1 when it ends, ½ a
/// minute later, ¼ two minutes later.
pub const P2C_HALF_LIFE_MS: u64 = 60_000;

/// A `p2c` record whose decayed weight fell below this (a single outcome four half-lives
/// old) is forgotten: the target counts as unknown again.
pub const P2C_FORGET_BELOW: f64 = 1.0 / 16.0;

/// How one combo orders its eligible targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Start at a per-combo counter (modulo the eligible count), the rest in rotation; the
    /// same start for `sticky` requests in a row.
    RoundRobin { sticky: u32 },
    /// One step drawn with probability weight / total, the rest by descending weight; the
    /// drawn step reused for `sticky` requests in a row while it stays eligible.
    Weighted { sticky: u32 },
    /// The written order (the ineligible ones are already out of it).
    FillFirst,
    /// A uniform shuffle per request.
    Random,
    /// A per-combo shuffled deck: each request takes the next eligible card, the rest
    /// follow shuffled; a fresh deck when no card left is eligible.
    StrictRandom,
    /// Ascending by the decaying count of attempts each target was sent recently.
    LeastUsed,
    /// The target (and connection) that last served the combo successfully first, the
    /// rest in the written order.
    Lkgp,
    /// Power of two choices: two distinct eligible targets drawn, the better scored
    /// ([`p2c_score`]) first (the second only when strictly better), the rest in the
    /// written order.
    P2c,
    /// Ascending by the target's input price; a target without one after every priced
    /// one; ties (and the unpriced) in the written order.
    CostOptimized,
}

impl Order {
    /// The ordering of `combo`'s strategy; `None` for the ones with an ordering of their
    /// own elsewhere (`priority` is the written order, `quota-share` is ordered by its home)
    /// or not built (`auto`: the written order).
    pub fn of(combo: &Combo) -> Option<Order> {
        let s = &combo.settings;
        match combo.strategy {
            ComboStrategy::RoundRobin => Some(Order::RoundRobin {
                sticky: s.sticky_round_robin_limit,
            }),
            ComboStrategy::Weighted => Some(Order::Weighted {
                sticky: s.sticky_weighted_limit,
            }),
            ComboStrategy::Fill => Some(Order::FillFirst),
            ComboStrategy::Random => Some(Order::Random),
            ComboStrategy::StrictRandom => Some(Order::StrictRandom),
            ComboStrategy::LeastUsed => Some(Order::LeastUsed),
            ComboStrategy::Lkgp => Some(Order::Lkgp),
            ComboStrategy::P2c => Some(Order::P2c),
            ComboStrategy::CostOptimized => Some(Order::CostOptimized),
            ComboStrategy::Priority | ComboStrategy::QuotaShare | ComboStrategy::Auto => None,
        }
    }
}

/// A small PRNG (splitmix64): fast, no dependencies; not for anything secret.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` ≥ 1; 0 for `n` = 0), by multiply-shift.
    pub fn below(&mut self, n: u64) -> u64 {
        let wide = u128::from(self.next_u64()) * u128::from(n);
        u64::try_from(wide >> 64).unwrap_or(0)
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = usize::try_from(self.below(i as u64 + 1)).unwrap_or(0);
            items.swap(i, j);
        }
    }
}

/// One eligible target of a request: its index in the combo's written target list, its
/// weight, whether its provider's breaker is half-open (an attempt would be its probe),
/// and its input price (USD per million input tokens, resolved at load; `None`: unknown).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    pub target: usize,
    pub weight: u32,
    pub half_open: bool,
    pub input_usd_per_mtok: Option<f64>,
}

/// A decaying count of attempts.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    count: f64,
    at_ms: u64,
}

impl Usage {
    fn at(self, now_ms: u64) -> f64 {
        if self.count == 0.0 {
            return 0.0;
        }
        let halves = now_ms.saturating_sub(self.at_ms) as f64 / LEAST_USED_HALF_LIFE_MS as f64;
        self.count * 0.5_f64.powf(halves)
    }
}

/// `p2c`: one target's recent attempt outcomes, each weighted by 2^(−age / half-life).
#[derive(Clone, Copy, Debug, Default)]
struct Record {
    /// Decayed count of outcomes, and of the successful ones.
    outcomes: f64,
    successes: f64,
    /// Decayed count of successes with a response head time, and the decayed sum of
    /// those times (ms).
    timed: f64,
    head_ms_sum: f64,
    at_ms: u64,
}

impl Record {
    /// This record decayed to `now_ms`.
    fn at(self, now_ms: u64) -> Record {
        let halves = now_ms.saturating_sub(self.at_ms) as f64 / P2C_HALF_LIFE_MS as f64;
        let f = 0.5_f64.powf(halves);
        Record {
            outcomes: self.outcomes * f,
            successes: self.successes * f,
            timed: self.timed * f,
            head_ms_sum: self.head_ms_sum * f,
            at_ms: now_ms.max(self.at_ms),
        }
    }

    /// Success rate in percent, `None` when unknown (nothing recorded recently).
    fn success_rate(&self) -> Option<f64> {
        (self.outcomes >= P2C_FORGET_BELOW).then(|| 100.0 * self.successes / self.outcomes)
    }

    /// Mean time to response head of the successes (ms), `None` when unknown.
    fn avg_latency_ms(&self) -> Option<f64> {
        (self.timed >= P2C_FORGET_BELOW).then(|| self.head_ms_sum / self.timed)
    }
}

/// A `p2c` score (spec B §3.2): success rate / 100 (0.5 when unknown) plus
/// 1 / log10(average latency ms + 10) (0.25 when unknown), less 0.25 when the provider's
/// breaker is half-open. An open breaker would score −∞; such a target is never eligible.
pub fn p2c_score(success_rate: Option<f64>, avg_latency_ms: Option<f64>, half_open: bool) -> f64 {
    let rate = success_rate.map_or(0.5, |r| r / 100.0);
    let speed = avg_latency_ms.map_or(0.25, |ms| 1.0 / (ms.max(0.0) + 10.0).log10());
    rate + speed - if half_open { 0.25 } else { 0.0 }
}

/// One combo's strategy state on one shard.
#[derive(Clone, Debug, Default)]
pub struct ComboState {
    /// Round-robin: the rotation counter and how many requests used its current start.
    counter: u64,
    uses: u32,
    /// Weighted: the drawn target and how many more requests may reuse it.
    pick: Option<(usize, u32)>,
    /// Strict-random: the cards (written target indices) left in the deck.
    deck: Vec<usize>,
    /// Least-used: per written target.
    usage: Vec<Usage>,
    /// Lkgp: the written target and connection that last served the combo.
    last_good: Option<(usize, ConnectionId)>,
    /// P2c: per written target.
    records: Vec<Record>,
}

impl ComboState {
    /// The order to try `steps` in: a permutation of `0..steps.len()`. `targets`: how many
    /// targets the combo has (every `Step::target` is below it).
    pub fn order(
        &mut self,
        how: Order,
        steps: &[Step],
        targets: usize,
        rng: &mut Rng,
        now_ms: u64,
    ) -> Vec<usize> {
        let n = steps.len();
        if n == 0 {
            return Vec::new();
        }
        match how {
            Order::RoundRobin { sticky } => {
                let start = usize::try_from(self.counter % n as u64).unwrap_or(0);
                self.uses += 1;
                if self.uses >= sticky.max(1) {
                    self.counter = self.counter.wrapping_add(1);
                    self.uses = 0;
                }
                (start..n).chain(0..start).collect()
            }
            Order::Weighted { sticky } => {
                let kept = self.pick.and_then(|(t, left)| {
                    let at = steps.iter().position(|s| s.target == t)?;
                    (left > 0).then(|| (at, left - 1))
                });
                let (first, left) = match kept {
                    Some(k) => k,
                    None => (draw(steps, rng), sticky.max(1) - 1),
                };
                self.pick = Some((steps[first].target, left));
                let mut rest: Vec<usize> = (0..n).filter(|&i| i != first).collect();
                rest.sort_by_key(|&i| std::cmp::Reverse(steps[i].weight));
                std::iter::once(first).chain(rest).collect()
            }
            Order::FillFirst => (0..n).collect(),
            Order::Random => {
                let mut order: Vec<usize> = (0..n).collect();
                rng.shuffle(&mut order);
                order
            }
            Order::StrictRandom => {
                let eligible = |card: &usize| steps.iter().position(|s| s.target == *card);
                let mut found = self.deck.iter().position(|c| eligible(c).is_some());
                if found.is_none() {
                    self.deck = (0..targets).collect();
                    rng.shuffle(&mut self.deck);
                    found = self.deck.iter().position(|c| eligible(c).is_some());
                }
                let first = match found {
                    Some(at) => eligible(&self.deck.remove(at)).unwrap_or(0),
                    // Steps name targets beyond `targets`: the caller's error; no card.
                    None => 0,
                };
                let mut rest: Vec<usize> = (0..n).filter(|&i| i != first).collect();
                rng.shuffle(&mut rest);
                std::iter::once(first).chain(rest).collect()
            }
            Order::LeastUsed => {
                let used = |i: usize| {
                    self.usage
                        .get(steps[i].target)
                        .map_or(0.0, |u| u.at(now_ms))
                };
                let mut order: Vec<usize> = (0..n).collect();
                // Stable: ties keep the written order.
                order.sort_by(|&a, &b| used(a).total_cmp(&used(b)));
                order
            }
            Order::Lkgp => {
                let good = self
                    .last_good
                    .and_then(|(t, _)| steps.iter().position(|s| s.target == t));
                match good {
                    Some(first) => first_then_written(first, n),
                    None => (0..n).collect(),
                }
            }
            Order::P2c => {
                if n == 1 {
                    return vec![0];
                }
                let a = usize::try_from(rng.below(n as u64)).unwrap_or(0);
                let mut b = usize::try_from(rng.below(n as u64 - 1)).unwrap_or(0);
                if b >= a {
                    b += 1;
                }
                let first = if self.score(&steps[b], now_ms) > self.score(&steps[a], now_ms) {
                    b
                } else {
                    a
                };
                first_then_written(first, n)
            }
            Order::CostOptimized => {
                let price = |i: usize| steps[i].input_usd_per_mtok.unwrap_or(f64::INFINITY);
                let mut order: Vec<usize> = (0..n).collect();
                // Stable: ties keep the written order.
                order.sort_by(|&a, &b| price(a).total_cmp(&price(b)));
                order
            }
        }
    }

    /// `p2c`: step `s`'s score now.
    fn score(&self, s: &Step, now_ms: u64) -> f64 {
        let r = self
            .records
            .get(s.target)
            .map_or(Record::default(), |r| r.at(now_ms));
        p2c_score(r.success_rate(), r.avg_latency_ms(), s.half_open)
    }

    /// `lkgp`: the connection that last served the combo, when it was on written target
    /// `target`.
    pub fn last_good_connection(&self, target: usize) -> Option<ConnectionId> {
        self.last_good.filter(|(t, _)| *t == target).map(|(_, c)| c)
    }

    /// `lkgp`: written target `target` on `connection` served the combo.
    pub fn served(&mut self, target: usize, connection: ConnectionId) {
        self.last_good = Some((target, connection));
    }

    /// `p2c`: an attempt on written target `target` ended, successfully or not; `head_ms`:
    /// how long its response head took (read for a success only).
    pub fn ended(&mut self, target: usize, ok: bool, head_ms: Option<u64>, now_ms: u64) {
        if self.records.len() <= target {
            self.records.resize(target + 1, Record::default());
        }
        let r = &mut self.records[target];
        let mut d = r.at(now_ms);
        d.outcomes += 1.0;
        if ok {
            d.successes += 1.0;
            if let Some(ms) = head_ms {
                d.timed += 1.0;
                d.head_ms_sum += ms as f64;
            }
        }
        *r = d;
    }

    /// `least-used`: an attempt was sent to written target `target`.
    pub fn used(&mut self, target: usize, now_ms: u64) {
        if self.usage.len() <= target {
            self.usage.resize(target + 1, Usage::default());
        }
        let u = &mut self.usage[target];
        *u = Usage {
            count: u.at(now_ms) + 1.0,
            at_ms: now_ms,
        };
    }
}

/// Position `first`, then the others in order.
fn first_then_written(first: usize, n: usize) -> Vec<usize> {
    std::iter::once(first)
        .chain((0..n).filter(|&i| i != first))
        .collect()
}

/// One step drawn with probability weight / total; uniform when every weight is 0.
fn draw(steps: &[Step], rng: &mut Rng) -> usize {
    let total: u64 = steps.iter().map(|s| u64::from(s.weight)).sum();
    if total == 0 {
        return usize::try_from(rng.below(steps.len() as u64)).unwrap_or(0);
    }
    let mut r = rng.below(total);
    for (i, s) in steps.iter().enumerate() {
        let w = u64::from(s.weight);
        if r < w {
            return i;
        }
        r -= w;
    }
    steps.len() - 1
}

/// What a combo's strategy state is keyed on besides its name: its strategy and targets
/// (provider, model, weight). A reload that changes any of them starts the state afresh.
pub fn fingerprint(combo: &Combo) -> u64 {
    // Streamed into the hasher: computed per request of a strategy combo, so no buffer.
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&[combo.strategy as u8]);
    for t in &combo.targets {
        h.update(&[0]);
        h.update(&t.provider.0.to_le_bytes());
        h.update(t.model.as_bytes());
        h.update(&[0]);
        h.update(&t.weight.to_le_bytes());
    }
    h.digest()
}

/// A shard's strategy state: every combo's, and the shard's PRNG.
#[derive(Debug, Default)]
pub struct Strategies {
    rng: Option<Rng>,
    /// Per combo name (a handful: searched in place): its fingerprint and state. Only the
    /// names of the configuration in force are kept (see [`Strategies::combo`]).
    combos: Vec<(String, u64, ComboState)>,
}

impl Strategies {
    /// Combo `name`'s state (fresh when its fingerprint changed) and the shard's PRNG,
    /// seeded on first use with `seed()`. `live`: whether a combo name is in the caller's
    /// configuration.
    pub fn combo(
        &mut self,
        name: &str,
        fingerprint: u64,
        seed: impl FnOnce() -> u64,
        live: impl Fn(&str) -> bool,
    ) -> (&mut ComboState, &mut Rng) {
        let rng = self.rng.get_or_insert_with(|| Rng::new(seed()));
        let at = match self.combos.iter().position(|(n, _, _)| n == name) {
            Some(at) => at,
            None => {
                // A new name: the combos a reload removed go first, so reloads that rename
                // combos do not grow the table.
                self.combos.retain(|(n, _, _)| live(n));
                self.combos
                    .push((name.to_owned(), fingerprint, ComboState::default()));
                self.combos.len() - 1
            }
        };
        let entry = &mut self.combos[at];
        if entry.1 != fingerprint {
            (entry.1, entry.2) = (fingerprint, ComboState::default());
        }
        (&mut entry.2, rng)
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;
    use super::*;
    use proptest::prelude::*;

    fn steps(targets: &[usize]) -> Vec<Step> {
        targets
            .iter()
            .map(|&t| Step {
                target: t,
                weight: 1,
                half_open: false,
                input_usd_per_mtok: None,
            })
            .collect()
    }

    /// Steps for written targets `0..`, priced as given.
    fn priced(prices: &[Option<f64>]) -> Vec<Step> {
        prices
            .iter()
            .enumerate()
            .map(|(t, &p)| Step {
                target: t,
                weight: 1,
                half_open: false,
                input_usd_per_mtok: p,
            })
            .collect()
    }

    fn firsts(how: Order, s: &[Step], n: usize, times: usize) -> Vec<usize> {
        let (mut st, mut rng) = (ComboState::default(), Rng::new(7));
        (0..times)
            .map(|_| s[st.order(how, s, n, &mut rng, 0)[0]].target)
            .collect()
    }

    #[test]
    fn round_robin_rotates_and_sticks() {
        let s = steps(&[0, 1, 2]);
        let how = Order::RoundRobin { sticky: 1 };
        let (mut st, mut rng) = (ComboState::default(), Rng::new(1));
        assert_eq!(st.order(how, &s, 3, &mut rng, 0), [0, 1, 2]);
        assert_eq!(st.order(how, &s, 3, &mut rng, 0), [1, 2, 0]);
        assert_eq!(st.order(how, &s, 3, &mut rng, 0), [2, 0, 1]);
        assert_eq!(st.order(how, &s, 3, &mut rng, 0), [0, 1, 2]);
        let sticky = Order::RoundRobin { sticky: 2 };
        assert_eq!(firsts(sticky, &s, 3, 6), [0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn round_robin_counts_modulo_the_eligible() {
        // Target 1 is out: the rotation runs over the two left.
        let s = steps(&[0, 2]);
        assert_eq!(
            firsts(Order::RoundRobin { sticky: 1 }, &s, 3, 4),
            [0, 2, 0, 2]
        );
    }

    #[test]
    fn weighted_draws_by_weight_and_never_a_zero() {
        let s = [
            Step {
                target: 0,
                weight: 3,
                half_open: false,
                input_usd_per_mtok: None,
            },
            Step {
                target: 1,
                weight: 1,
                half_open: false,
                input_usd_per_mtok: None,
            },
            Step {
                target: 2,
                weight: 0,
                half_open: false,
                input_usd_per_mtok: None,
            },
        ];
        let got = firsts(Order::Weighted { sticky: 1 }, &s, 3, 4000);
        let a = got.iter().filter(|&&t| t == 0).count();
        assert!((2700..3300).contains(&a), "{a}");
        assert!(!got.contains(&2));
        // The rest by descending weight.
        let (mut st, mut rng) = (ComboState::default(), Rng::new(3));
        for _ in 0..50 {
            let o = st.order(Order::Weighted { sticky: 1 }, &s, 3, &mut rng, 0);
            assert_eq!(o[2], 2, "{o:?}");
        }
    }

    #[test]
    fn weighted_all_zero_is_uniform_and_sticky_reuses_the_draw() {
        let s: Vec<Step> = (0..2)
            .map(|t| Step {
                target: t,
                weight: 0,
                half_open: false,
                input_usd_per_mtok: None,
            })
            .collect();
        let got = firsts(Order::Weighted { sticky: 1 }, &s, 2, 2000);
        let a = got.iter().filter(|&&t| t == 0).count();
        assert!((800..1200).contains(&a), "{a}");
        let got = firsts(Order::Weighted { sticky: 3 }, &s, 2, 300);
        for chunk in got.chunks(3) {
            assert!(chunk.iter().all(|&t| t == chunk[0]), "{got:?}");
        }
    }

    #[test]
    fn a_sticky_pick_that_is_no_longer_eligible_is_drawn_again() {
        let (mut st, mut rng) = (ComboState::default(), Rng::new(5));
        let how = Order::Weighted { sticky: 100 };
        let all = steps(&[0, 1]);
        let first = all[st.order(how, &all, 2, &mut rng, 0)[0]].target;
        let other = steps(&[1 - first]);
        assert_eq!(st.order(how, &other, 2, &mut rng, 0), [0]);
        // The new draw is the pick now.
        assert_eq!(
            all[st.order(how, &all, 2, &mut rng, 0)[0]].target,
            1 - first
        );
    }

    #[test]
    fn strict_random_deals_every_target_once_per_deck() {
        let s = steps(&[0, 1, 2, 3]);
        let got = firsts(Order::StrictRandom, &s, 4, 40);
        for deck in got.chunks(4) {
            let mut d = deck.to_vec();
            d.sort_unstable();
            assert_eq!(d, [0, 1, 2, 3], "{got:?}");
        }
    }

    #[test]
    fn strict_random_skips_an_ineligible_card_and_keeps_it() {
        let (mut st, mut rng) = (ComboState::default(), Rng::new(9));
        let all = steps(&[0, 1, 2]);
        // Target 2 is out for two requests, then back: it is dealt before the deck ends.
        let some = steps(&[0, 1]);
        let a = some[st.order(Order::StrictRandom, &some, 3, &mut rng, 0)[0]].target;
        let b = some[st.order(Order::StrictRandom, &some, 3, &mut rng, 0)[0]].target;
        assert_ne!(a, b);
        assert_eq!(
            all[st.order(Order::StrictRandom, &all, 3, &mut rng, 0)[0]].target,
            2
        );
    }

    #[test]
    fn least_used_goes_to_the_least_recently_used_and_counts_decay() {
        let s = steps(&[0, 1, 2]);
        let (mut st, mut rng) = (ComboState::default(), Rng::new(1));
        // Ties keep the written order.
        assert_eq!(st.order(Order::LeastUsed, &s, 3, &mut rng, 0), [0, 1, 2]);
        st.used(0, 0);
        st.used(0, 0);
        st.used(1, 0);
        assert_eq!(st.order(Order::LeastUsed, &s, 3, &mut rng, 0), [2, 1, 0]);
        // Two half-lives later target 0's two attempts weigh ½; a fresh one on 2 weighs 1.
        let later = 2 * LEAST_USED_HALF_LIFE_MS;
        st.used(2, later);
        assert_eq!(
            st.order(Order::LeastUsed, &s, 3, &mut rng, later),
            [1, 0, 2]
        );
    }

    #[test]
    fn fill_first_keeps_the_written_order() {
        let s = steps(&[0, 2]);
        let (mut st, mut rng) = (ComboState::default(), Rng::new(1));
        assert_eq!(st.order(Order::FillFirst, &s, 3, &mut rng, 0), [0, 1]);
    }

    #[test]
    fn a_changed_fingerprint_starts_afresh() {
        let mut t = Strategies::default();
        let s = steps(&[0, 1]);
        let how = Order::RoundRobin { sticky: 1 };
        let (st, rng) = t.combo("c", 1, || 0, |_| true);
        st.order(how, &s, 2, rng, 0);
        let (st, rng) = t.combo("c", 1, || 0, |_| true);
        assert_eq!(st.order(how, &s, 2, rng, 0), [1, 0]);
        let (st, rng) = t.combo("c", 2, || 0, |_| true);
        assert_eq!(st.order(how, &s, 2, rng, 0), [0, 1]);
    }

    #[test]
    fn combos_a_reload_removed_are_forgotten_when_another_is_added() {
        let mut t = Strategies::default();
        // Reloads renaming the combo each time: only the live names stay.
        for i in 0..100 {
            let name = format!("c{i}");
            t.combo(&name, 1, || 0, |n| n == name);
            assert_eq!(t.combos.len(), 1, "after {name}");
        }
        // A live combo's state survives another's first request.
        let s = steps(&[0, 1]);
        let how = Order::RoundRobin { sticky: 1 };
        let both = |n: &str| n == "a" || n == "b";
        let (st, rng) = t.combo("a", 1, || 0, both);
        st.order(how, &s, 2, rng, 0);
        t.combo("b", 1, || 0, both);
        let (st, rng) = t.combo("a", 1, || 0, both);
        assert_eq!(st.order(how, &s, 2, rng, 0), [1, 0]);
        assert_eq!(t.combos.len(), 2);
    }

    #[test]
    fn lkgp_puts_the_last_good_first_and_keeps_the_written_order_otherwise() {
        let s = steps(&[0, 1, 2, 3]);
        let (mut st, mut rng) = (ComboState::default(), Rng::new(1));
        // Nothing served yet: the written order.
        assert_eq!(st.order(Order::Lkgp, &s, 4, &mut rng, 0), [0, 1, 2, 3]);
        st.served(2, ConnectionId(7));
        assert_eq!(st.order(Order::Lkgp, &s, 4, &mut rng, 0), [2, 0, 1, 3]);
        assert_eq!(st.last_good_connection(2), Some(ConnectionId(7)));
        assert_eq!(st.last_good_connection(1), None);
        // The last good is ruled out now: the written order of the rest; it stays the
        // last good for when it is back.
        let some = steps(&[0, 1, 3]);
        assert_eq!(st.order(Order::Lkgp, &some, 4, &mut rng, 0), [0, 1, 2]);
        assert_eq!(st.order(Order::Lkgp, &s, 4, &mut rng, 0), [2, 0, 1, 3]);
        // The latest success wins.
        st.served(3, ConnectionId(1));
        assert_eq!(st.order(Order::Lkgp, &s, 4, &mut rng, 0), [3, 0, 1, 2]);
        assert_eq!(st.last_good_connection(2), None);
    }

    #[test]
    fn p2c_scores_by_success_rate_latency_and_a_half_open_breaker() {
        // Unknown: 0.5 + 0.25.
        assert!((p2c_score(None, None, false) - 0.75).abs() < 1e-9);
        // Every attempt served, heads in 90 ms: 1 + 1 / log10(100).
        assert!((p2c_score(Some(100.0), Some(90.0), false) - 1.5).abs() < 1e-9);
        // Half served, heads in 0 ms: 0.5 + 1 / log10(10).
        assert!((p2c_score(Some(50.0), Some(0.0), false) - 1.5).abs() < 1e-9);
        // A half-open breaker costs 0.25.
        assert!((p2c_score(None, None, true) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn p2c_records_decay_and_are_forgotten() {
        let mut st = ComboState::default();
        let s = Step {
            target: 1,
            weight: 1,
            half_open: false,
            input_usd_per_mtok: None,
        };
        assert!((st.score(&s, 0) - 0.75).abs() < 1e-9);
        // One failure, then a success a half-life later with a 90 ms head: the failure
        // weighs ½, the success 1: a rate of 2/3, a latency of 90 ms.
        st.ended(1, false, Some(5), 0);
        st.ended(1, true, Some(90), P2C_HALF_LIFE_MS);
        let want = 2.0 / 3.0 + 0.5;
        assert!((st.score(&s, P2C_HALF_LIFE_MS) - want).abs() < 1e-9);
        // Decay alone keeps the ratio.
        assert!((st.score(&s, 3 * P2C_HALF_LIFE_MS) - want).abs() < 1e-9);
        // Four half-lives after the success its weight is 1/16: still known; a fifth
        // takes it (and the failure's) below: unknown again.
        assert!((st.score(&s, 5 * P2C_HALF_LIFE_MS) - want).abs() < 1e-9);
        assert!((st.score(&s, 6 * P2C_HALF_LIFE_MS) - 0.75).abs() < 1e-9);
    }

    #[test]
    fn p2c_takes_the_second_draw_only_when_strictly_better() {
        let s = steps(&[0, 1, 2]);
        // Unknown alike: the first drawn goes first, so each target about a third of the
        // time; the rest keep the written order.
        let (mut st, mut rng) = (ComboState::default(), Rng::new(11));
        let mut first = [0usize; 3];
        for _ in 0..3000 {
            let o = st.order(Order::P2c, &s, 3, &mut rng, 0);
            let rest: Vec<usize> = (0..3).filter(|&i| i != o[0]).collect();
            assert_eq!(o[1..], rest[..], "{o:?}");
            first[o[0]] += 1;
        }
        for f in first {
            assert!((850..1150).contains(&f), "{first:?}");
        }
        // Target 1 fails: it goes first only when drawn with… nothing better: never,
        // since both others score higher; target 2 serves fast: first whenever drawn.
        st.ended(1, false, None, 0);
        st.ended(2, true, Some(0), 0);
        let mut first = [0usize; 3];
        for _ in 0..3000 {
            first[st.order(Order::P2c, &s, 3, &mut rng, 0)[0]] += 1;
        }
        assert_eq!(first[1], 0, "{first:?}");
        // Target 2 is in two of the three pairs, and wins both.
        assert!((1850..2150).contains(&first[2]), "{first:?}");
    }

    #[test]
    fn p2c_prefers_the_target_whose_breaker_is_not_half_open() {
        let s = [
            Step {
                target: 0,
                weight: 1,
                half_open: true,
                input_usd_per_mtok: None,
            },
            Step {
                target: 1,
                weight: 1,
                half_open: false,
                input_usd_per_mtok: None,
            },
        ];
        let got = firsts(Order::P2c, &s, 2, 200);
        assert!(got.iter().all(|&t| t == 1), "{got:?}");
        // One eligible target: it.
        let one = steps(&[1]);
        assert_eq!(firsts(Order::P2c, &one, 2, 5), [1; 5]);
    }

    #[test]
    fn cost_optimized_puts_the_cheapest_first_and_the_unpriced_last() {
        let (mut st, mut rng) = (ComboState::default(), Rng::new(1));
        let how = Order::CostOptimized;
        // Written: 2.5, unpriced, 0.15, 10, 0.
        let s = priced(&[Some(2.5), None, Some(0.15), Some(10.0), Some(0.0)]);
        assert_eq!(st.order(how, &s, 5, &mut rng, 0), [4, 2, 0, 3, 1]);
        // Ties, priced or not, keep the written order.
        let s = priced(&[None, Some(1.0), None, Some(1.0), Some(0.5)]);
        assert_eq!(st.order(how, &s, 5, &mut rng, 0), [4, 1, 3, 0, 2]);
        // Nothing priced: the written order.
        let s = priced(&[None, None, None]);
        assert_eq!(st.order(how, &s, 3, &mut rng, 0), [0, 1, 2]);
        // The ruled-out are already gone: the cheapest eligible first.
        let mut s = priced(&[Some(3.0), Some(1.0), Some(2.0)]);
        s.remove(1);
        assert_eq!(st.order(how, &s, 3, &mut rng, 0), [1, 0]);
        // Stateless: the same answer every time.
        let s = priced(&[Some(2.0), Some(1.0)]);
        for _ in 0..3 {
            assert_eq!(st.order(how, &s, 2, &mut rng, 0), [1, 0]);
        }
    }

    fn any_order() -> impl Strategy<Value = Order> {
        prop_oneof![
            (1u32..4).prop_map(|sticky| Order::RoundRobin { sticky }),
            (1u32..4).prop_map(|sticky| Order::Weighted { sticky }),
            Just(Order::FillFirst),
            Just(Order::Random),
            Just(Order::StrictRandom),
            Just(Order::LeastUsed),
            Just(Order::Lkgp),
            Just(Order::P2c),
            Just(Order::CostOptimized),
        ]
    }

    proptest! {
        #[test]
        fn every_ordering_is_a_permutation_of_the_eligible(
            how in any_order(),
            seed in any::<u64>(),
            // Per request: which of 6 targets are eligible, and their weights.
            requests in prop::collection::vec(
                prop::collection::vec((any::<bool>(), 0u32..5), 6),
                1..20,
            ),
            // Per target: its price (none, or a few values so that ties occur).
            prices in prop::collection::vec(prop::option::of(0u8..4), 6),
        ) {
            let (mut st, mut rng) = (ComboState::default(), Rng::new(seed));
            for (now, req) in requests.iter().enumerate() {
                let s: Vec<Step> = req
                    .iter()
                    .enumerate()
                    .filter(|(_, (on, _))| *on)
                    .map(|(t, (_, w))| Step {
                        target: t,
                        weight: *w,
                        half_open: *w == 4,
                        input_usd_per_mtok: prices[t].map(|p| f64::from(p) * 0.5),
                    })
                    .collect();
                let now = now as u64 * 1_000;
                let mut o = st.order(how, &s, 6, &mut rng, now);
                if let Some(&first) = o.first() {
                    let t = s[first].target;
                    st.used(t, now);
                    // Odd targets fail, even ones serve (and are the last good).
                    let ok = t.is_multiple_of(2);
                    st.ended(t, ok, Some(now % 700), now);
                    if ok {
                        st.served(t, ConnectionId(u32::try_from(t).unwrap_or(0)));
                    }
                }
                o.sort_unstable();
                prop_assert_eq!(o, (0..s.len()).collect::<Vec<_>>());
            }
        }
    }
}
