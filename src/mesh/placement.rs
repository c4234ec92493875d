//! Who owns a key: `owner(hash, shards) = hash % shards` (ARCHITECTURE.md §1.2), and the
//! stable hashes that feed it.
//!
//! Every piece of global state (a provider's breaker, a connection's cooldown and permits, a
//! lockout) lives on exactly one shard, and every shard must compute the same owner for the
//! same key — in this process, after a restart, and in the next release (the snapshot is
//! reloaded into owners by the same function). So the hash is ours and fixed, never std's
//! randomly keyed SipHash, and never `std::hash::Hash` (whose byte stream for a type is not a
//! stability promise: `str` appends a terminator, integers follow the platform's layout):
//!
//! | key | hash |
//! |---|---|
//! | [`ProviderKey`] `p` | `mix64(DOMAIN_PROVIDER \| p)` |
//! | [`ConnectionKey`] `c` | `mix64(DOMAIN_CONNECTION \| c)` |
//! | string `s` (session keys, model keys) | `mix64(fnv1a64(utf8 bytes of s))` |
//! | pair `(a, b)` (connection × model) | `mix64(DOMAIN_PAIR ^ hash(a) ^ hash(b).rotate_left(32))` |
//! | the global concurrency gate (the gate home's `Global`) | `mix64(DOMAIN_GLOBAL)` |
//! | quota-share selection (the quota-share home) | `mix64(DOMAIN_GLOBAL \| 1)` |
//!
//! [`fnv1a64`] is 64-bit FNV-1a (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`);
//! [`mix64`] is the splitmix64 finaliser (Stafford's "Mix13"), a bijection that spreads every
//! input bit over the low bits that `%` keeps. The domain tags keep provider 3 and
//! connection 3 from landing on the same shard by construction. The golden values in the tests
//! pin all of this: changing one is a breaking change to the snapshot's ownership.
//!
//! Shard 0 additionally owns all lease state (§3); that is the lease module's rule, not a hash.

/// FNV-1a 64-bit offset basis.
pub const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64-bit prime.
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Domain tag of provider ids (top byte), so they never alias connection ids.
pub const DOMAIN_PROVIDER: u64 = 0x01 << 56;
/// Domain tag of connection ids.
pub const DOMAIN_CONNECTION: u64 = 0x02 << 56;
/// Domain tag mixed into pair keys.
pub const DOMAIN_PAIR: u64 = 0x03 << 56;
/// Domain tag of the process-wide singletons (the global concurrency gate, quota-share
/// selection).
pub const DOMAIN_GLOBAL: u64 = 0x04 << 56;

/// The shard that owns the key whose stable hash is `key_hash`: `key_hash % shards`
/// (0 when there are no shards, so the function never panics).
pub fn owner(key_hash: u64, shards: usize) -> usize {
    match u64::try_from(shards) {
        Ok(0) | Err(_) => 0,
        // The remainder is below `shards`, so it fits a usize.
        Ok(n) => usize::try_from(key_hash % n).unwrap_or(0),
    }
}

/// The owner of `key` among `shards`.
pub fn owner_of<K: OwnerKey + ?Sized>(key: &K, shards: usize) -> usize {
    owner(key.owner_hash(), shards)
}

/// 64-bit FNV-1a of `bytes`.
pub const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash = FNV_OFFSET_BASIS;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    hash
}

/// The splitmix64 finaliser: a bijection on `u64` with full avalanche.
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A key with a stable, documented hash (see the table in the module docs).
pub trait OwnerKey {
    fn owner_hash(&self) -> u64;
}

/// A provider's key (its dense id); `config::ProviderId` hashes as this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderKey(pub u16);

/// A connection's key (its dense id); `config::ConnectionId` hashes as this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionKey(pub u32);

impl OwnerKey for ProviderKey {
    fn owner_hash(&self) -> u64 {
        mix64(DOMAIN_PROVIDER | u64::from(self.0))
    }
}

impl OwnerKey for ConnectionKey {
    fn owner_hash(&self) -> u64 {
        mix64(DOMAIN_CONNECTION | u64::from(self.0))
    }
}

impl OwnerKey for str {
    fn owner_hash(&self) -> u64 {
        mix64(fnv1a64(self.as_bytes()))
    }
}

impl OwnerKey for String {
    fn owner_hash(&self) -> u64 {
        self.as_str().owner_hash()
    }
}

impl<K: OwnerKey + ?Sized> OwnerKey for &K {
    fn owner_hash(&self) -> u64 {
        (**self).owner_hash()
    }
}

impl<A: OwnerKey, B: OwnerKey> OwnerKey for (A, B) {
    fn owner_hash(&self) -> u64 {
        mix64(DOMAIN_PAIR ^ self.0.owner_hash() ^ self.1.owner_hash().rotate_left(32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn mix64_matches_splitmix64() {
        // splitmix64 seeded with 0 returns mix64(0x9e3779b97f4a7c15) first.
        assert_eq!(mix64(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix64(0), 0);
    }

    /// Ownership must not change between releases (snapshots are reloaded into owners).
    #[test]
    fn golden_owners_are_pinned() {
        let got: Vec<usize> = [
            owner_of(&ProviderKey(0), 8),
            owner_of(&ProviderKey(1), 8),
            owner_of(&ConnectionKey(0), 8),
            owner_of(&ConnectionKey(1), 8),
            owner_of(&ConnectionKey(1234), 64),
            owner_of("session-abc", 8),
            owner_of(&(ConnectionKey(7), "gpt-4o"), 16),
        ]
        .to_vec();
        assert_eq!(got, GOLDEN);
        assert_eq!(ProviderKey(0).owner_hash(), GOLDEN_PROVIDER_0_HASH);
    }

    // Computed independently (a ten-line Python transcription of the table in the module docs).
    const GOLDEN: [usize; 7] = [6, 7, 0, 4, 0, 6, 14];
    const GOLDEN_PROVIDER_0_HASH: u64 = 0x7440_30a1_a84c_6ab6;

    #[test]
    fn no_shards_or_one_shard_means_shard_zero() {
        assert_eq!(owner(u64::MAX, 0), 0);
        assert_eq!(owner(u64::MAX, 1), 0);
        assert_eq!(owner(5, 3), 2);
    }

    #[test]
    fn references_strings_and_strs_agree() {
        let s = String::from("conn:42");
        assert_eq!(s.owner_hash(), "conn:42".owner_hash());
        assert_eq!(OwnerKey::owner_hash(&&s), s.owner_hash());
        assert_ne!(
            (ConnectionKey(1), ConnectionKey(2)).owner_hash(),
            (ConnectionKey(2), ConnectionKey(1)).owner_hash()
        );
    }

    /// Pearson's chi-square of the bucket counts against a uniform spread, and the bound we
    /// accept: mean + 6 standard deviations of the chi-square distribution with `k - 1` degrees
    /// of freedom (the inputs are fixed, so this is a deterministic check of the hash, not a
    /// flaky statistical test).
    fn chi_square(owners: impl Iterator<Item = usize>, shards: usize) -> (f64, f64) {
        let mut counts = vec![0u64; shards];
        let mut total = 0u64;
        for o in owners {
            assert!(o < shards);
            counts[o] += 1;
            total += 1;
        }
        let expected = total as f64 / shards as f64;
        let chi2 = counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        let dof = (shards - 1) as f64;
        (chi2, dof + 6.0 * (2.0 * dof).sqrt())
    }

    #[test]
    fn sequential_ids_spread_evenly_over_every_shard_count() {
        for shards in 2..=64 {
            let (c2, bound) = chi_square(
                (0..4096u32).map(|i| owner_of(&ConnectionKey(i), shards)),
                shards,
            );
            assert!(
                c2 < bound,
                "connections over {shards}: chi2 {c2} >= {bound}"
            );
            let (c2, bound) = chi_square(
                (0..4096u16).map(|i| owner_of(&ProviderKey(i), shards)),
                shards,
            );
            assert!(c2 < bound, "providers over {shards}: chi2 {c2} >= {bound}");
        }
    }

    #[test]
    fn string_and_pair_keys_spread_evenly() {
        for shards in [2, 3, 4, 7, 8, 16, 32, 64] {
            let (c2, bound) = chi_square(
                (0..8192).map(|i| owner_of(format!("session-{i:08x}").as_str(), shards)),
                shards,
            );
            assert!(c2 < bound, "strings over {shards}: chi2 {c2} >= {bound}");
            let (c2, bound) = chi_square(
                (0..64u32).flat_map(|c| {
                    (0..64)
                        .map(move |m| owner_of(&(ConnectionKey(c), format!("model-{m}")), shards))
                }),
                shards,
            );
            assert!(c2 < bound, "pairs over {shards}: chi2 {c2} >= {bound}");
        }
    }

    #[test]
    fn providers_and_connections_with_equal_ids_are_independent() {
        let shards = 8;
        let same = (0..4096u16)
            .filter(|&i| {
                owner_of(&ProviderKey(i), shards) == owner_of(&ConnectionKey(u32::from(i)), shards)
            })
            .count();
        // Independent owners agree 1/8 of the time: 512 expected, sd ~21.
        assert!((400..=624).contains(&same), "{same} of 4096 agree");
    }

    proptest! {
        #[test]
        fn the_owner_is_always_a_shard(hash in any::<u64>(), shards in 1usize..1024) {
            prop_assert!(owner(hash, shards) < shards);
        }
    }
}
