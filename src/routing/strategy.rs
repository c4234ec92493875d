//! Combo ordering strategies (spec B §3.2): the order in which one request tries a combo's
//! eligible targets. Pure: no I/O, no clock reads (the caller passes `now_ms`), randomness
//! from an [`Rng`] the caller owns. The proxy hands in the targets the local views let
//! through now (the pre-dispatch filters of B §3.1), each as a [`Step`]; an ordering is a
//! permutation of their positions.
//!
//! State is per combo ([`ComboState`]) and per shard ([`Strategies`], the shard's private
//! table): with several shards each rotates, draws and counts on its own. A combo whose
//! strategy or targets changed (a reload) starts again from fresh state.

use crate::config::{Combo, ComboStrategy};

/// Half-life of the `least-used` usage counts: an attempt counts 1 when made, ½ a minute
/// later, ¼ two minutes later.
pub const LEAST_USED_HALF_LIFE_MS: u64 = 60_000;

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
}

impl Order {
    /// The ordering of `combo`'s strategy; `None` for the ones with an ordering of their
    /// own elsewhere (`priority` is the written order, `quota-share` is ordered by its home)
    /// or not built (`auto`, `cost-optimized`: the written order).
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
            ComboStrategy::Priority
            | ComboStrategy::QuotaShare
            | ComboStrategy::Auto
            | ComboStrategy::CostOptimized => None,
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

/// One eligible target of a request: its index in the combo's written target list and its
/// weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub target: usize,
    pub weight: u32,
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
        }
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
    /// Per combo name (a handful: searched in place): its fingerprint and state.
    combos: Vec<(String, u64, ComboState)>,
}

impl Strategies {
    /// Combo `name`'s state (fresh when its fingerprint changed) and the shard's PRNG,
    /// seeded on first use with `seed()`.
    pub fn combo(
        &mut self,
        name: &str,
        fingerprint: u64,
        seed: impl FnOnce() -> u64,
    ) -> (&mut ComboState, &mut Rng) {
        let rng = self.rng.get_or_insert_with(|| Rng::new(seed()));
        let at = match self.combos.iter().position(|(n, _, _)| n == name) {
            Some(at) => at,
            None => {
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
            },
            Step {
                target: 1,
                weight: 1,
            },
            Step {
                target: 2,
                weight: 0,
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
        let (st, rng) = t.combo("c", 1, || 0);
        st.order(how, &s, 2, rng, 0);
        let (st, rng) = t.combo("c", 1, || 0);
        assert_eq!(st.order(how, &s, 2, rng, 0), [1, 0]);
        let (st, rng) = t.combo("c", 2, || 0);
        assert_eq!(st.order(how, &s, 2, rng, 0), [0, 1]);
    }

    fn any_order() -> impl Strategy<Value = Order> {
        prop_oneof![
            (1u32..4).prop_map(|sticky| Order::RoundRobin { sticky }),
            (1u32..4).prop_map(|sticky| Order::Weighted { sticky }),
            Just(Order::FillFirst),
            Just(Order::Random),
            Just(Order::StrictRandom),
            Just(Order::LeastUsed),
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
        ) {
            let (mut st, mut rng) = (ComboState::default(), Rng::new(seed));
            for (now, req) in requests.iter().enumerate() {
                let s: Vec<Step> = req
                    .iter()
                    .enumerate()
                    .filter(|(_, (on, _))| *on)
                    .map(|(t, (_, w))| Step { target: t, weight: *w })
                    .collect();
                let now = now as u64 * 1_000;
                let mut o = st.order(how, &s, 6, &mut rng, now);
                if let Some(&first) = o.first() {
                    st.used(s[first].target, now);
                }
                o.sort_unstable();
                prop_assert_eq!(o, (0..s.len()).collect::<Vec<_>>());
            }
        }
    }
}
