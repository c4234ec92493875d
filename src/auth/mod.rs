//! Client authentication: a key from `Authorization: Bearer` or `x-api-key`, looked up by
//! its SHA-256 digest (plain keys are hashed at start-up), so the lookup time says nothing
//! about how much of a guess was right.
//!
//! Each shard keeps, per configuration generation, the last few keys that identified a
//! client ([`KeyCache`]): a request presenting one of them again skips the digest. A hit
//! needs the presented bytes equal to a cached key's, compared in constant time over the
//! key's length, so the time a miss takes still says nothing about a partly right guess.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use sha2::{Digest, Sha256};

use crate::config::{Config, KeySecret};
use crate::http1::RequestHead;

/// Index of the configured client keys by digest.
#[derive(Debug, Default)]
pub struct KeyIndex {
    by_digest: HashMap<[u8; 32], usize, DigestHash>,
    admin_digest: Option<[u8; 32]>,
}

/// Hashes the index's keys. They are SHA-256 digests, uniform already: a multiply-rotate
/// fold of their words under a per-process random seed places them as well as SipHash did,
/// for a fraction of its cost on every request. Only configured keys are ever inserted.
struct DigestHash {
    seed: u64,
}

impl Default for DigestHash {
    fn default() -> Self {
        Self {
            seed: RandomState::new().build_hasher().finish(),
        }
    }
}

impl BuildHasher for DigestHash {
    type Hasher = DigestHasher;

    fn build_hasher(&self) -> DigestHasher {
        DigestHasher(self.seed)
    }
}

struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for w in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..w.len()].copy_from_slice(w);
            self.0 =
                (self.0.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
}

fn digest(s: &[u8]) -> [u8; 32] {
    Sha256::digest(s).into()
}

/// Outcome of authenticating a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// No client keys are configured: the gateway is open (logged at start-up).
    Open,
    /// A configured client key, by index in `Config::client_keys`.
    Key(usize),
    /// The admin token.
    Admin,
    /// A key was required and none matched.
    Denied,
}

impl KeyIndex {
    pub fn new(config: &Config) -> Self {
        let mut by_digest = HashMap::default();
        for (i, k) in config.client_keys.iter().enumerate() {
            let d = match &k.secret {
                KeySecret::Plain(s) => digest(s.as_bytes()),
                KeySecret::Sha256(d) => *d,
            };
            by_digest.insert(d, i);
        }
        let admin_digest = config
            .server
            .admin_token
            .as_deref()
            .map(|t| digest(t.as_bytes()));
        Self {
            by_digest,
            admin_digest,
        }
    }

    pub fn is_open(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Identifies the caller of a request.
    pub fn identify(&self, head: &RequestHead) -> Caller {
        match presented_key(head) {
            Some(presented) => self.identify_key(presented),
            None => self.without_key(),
        }
    }

    /// The caller of a request that presents no key.
    fn without_key(&self) -> Caller {
        if self.is_open() {
            Caller::Open
        } else {
            Caller::Denied
        }
    }

    /// The caller presenting `presented` (trimmed, non-empty).
    fn identify_key(&self, presented: &[u8]) -> Caller {
        let d = digest(presented);
        if self.admin_digest == Some(d) {
            return Caller::Admin;
        }
        match self.by_digest.get(&d) {
            Some(i) => Caller::Key(*i),
            None if self.is_open() => Caller::Open,
            None => Caller::Denied,
        }
    }
}

/// How many presented keys one shard remembers per configuration generation.
const CACHED_KEYS: usize = 8;

/// The client keys recently presented on one shard under one configuration generation, with
/// the client each identified. It lives in the generation (`shard::Generation`): a reload or
/// a runtime-settings change starts a new, empty one, so a key revoked by a reload is never
/// served from here. Only keys that identified a configured client are kept (never a
/// denied guess, never the admin token); the oldest entry gives way to a new one.
#[derive(Debug, Default)]
pub struct KeyCache {
    entries: RefCell<Vec<(Box<[u8]>, usize)>>,
    /// The slot the next new key replaces once every slot is taken.
    next: Cell<usize>,
}

impl KeyCache {
    /// Identifies the caller of a request as [`KeyIndex::identify`] does, with `index` the
    /// key index of the generation this cache belongs to.
    pub fn identify(&self, index: &KeyIndex, head: &RequestHead) -> Caller {
        let Some(presented) = presented_key(head) else {
            return index.without_key();
        };
        if let Some(i) = self.lookup(presented) {
            return Caller::Key(i);
        }
        let caller = index.identify_key(presented);
        if let Caller::Key(i) = caller {
            self.remember(presented, i);
        }
        caller
    }

    fn lookup(&self, presented: &[u8]) -> Option<usize> {
        let entries = self.entries.borrow();
        entries
            .iter()
            .find(|(key, _)| same_bytes(key, presented))
            .map(|(_, i)| *i)
    }

    fn remember(&self, presented: &[u8], client: usize) {
        let mut entries = self.entries.borrow_mut();
        let entry = (Box::from(presented), client);
        if entries.len() < CACHED_KEYS {
            entries.push(entry);
            return;
        }
        let slot = self.next.get() % CACHED_KEYS;
        self.next.set((slot + 1) % CACHED_KEYS);
        if let Some(e) = entries.get_mut(slot) {
            *e = entry;
        }
    }
}

/// Whether `a` and `b` are the same bytes, in a time that depends on their lengths only
/// (every byte pair is compared; no early exit on the first difference).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The key a request presents: `Authorization: Bearer <k>` first, then `x-api-key`.
pub fn presented_key(head: &RequestHead) -> Option<&[u8]> {
    if let Some(k) = head.header("authorization").and_then(bearer_key) {
        return Some(k);
    }
    head.header("x-api-key").map(trim).filter(|k| !k.is_empty())
}

/// The key of an `Authorization` value `Bearer <k>` (scheme ASCII case-insensitive, the
/// value and the key trimmed of ASCII whitespace; `None` without a non-empty key).
fn bearer_key(value: &[u8]) -> Option<&[u8]> {
    /// `bearer ` in the first seven bytes of a little-endian word, the eighth zero.
    const BEARER: u64 = u64::from_le_bytes(*b"bearer \0");
    /// Lower-cases the six letters: `x | 0x20 == y` for a lower-case letter `y` holds only
    /// for `y` and its upper case (0x20 is the one bit they differ in).
    const FOLD: u64 = 0x0000_2020_2020_2020;
    /// The space is compared as it is (NUL `| 0x20` would pass for it); the eighth byte
    /// is the key's.
    const SCHEME: u64 = 0x00ff_ffff_ffff_ffff;
    let v = trim(value);
    // At least one byte after the scheme (`v.len() > 7`): the scheme alone is no key.
    let word = u64::from_le_bytes(*v.first_chunk::<8>()?);
    if (word | FOLD) & SCHEME != BEARER {
        return None;
    }
    // `v` ends in a byte that is not whitespace (it is trimmed and longer than the scheme):
    // only the key's start needs trimming.
    let k = trim_start(&v[7..]);
    (!k.is_empty()).then_some(k)
}

fn trim(v: &[u8]) -> &[u8] {
    let v = trim_start(v);
    match v.iter().rposition(|b| !b.is_ascii_whitespace()) {
        Some(end) => &v[..=end],
        None => &[],
    }
}

fn trim_start(v: &[u8]) -> &[u8] {
    match v.iter().position(|b| !b.is_ascii_whitespace()) {
        Some(start) => &v[start..],
        None => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn config(toml: &str) -> Config {
        crate::config::load_str(toml, &|name| {
            (name == "TG_TEST_ADMIN").then(|| "admin-token".to_owned())
        })
        .map(|o| o.config)
        .unwrap_or_else(|e| panic!("config: {e}"))
    }

    fn head(key: Option<&str>) -> RequestHead {
        let auth = key.map_or(String::new(), |k| format!("authorization: Bearer {k}\r\n"));
        let mut buf = BytesMut::from(
            format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n{auth}\r\n").as_str(),
        );
        match crate::http1::decode_request_head(&mut buf) {
            Ok(crate::http1::Decoded::Complete(h)) => h,
            other => panic!("head: {other:?}"),
        }
    }

    const KEYS: &str = "[server]\nadmin_token_env = \"TG_TEST_ADMIN\"\n\n[[client_keys]]\nid = \"a\"\nkey = \"key-a\"\n\n[[client_keys]]\nid = \"b\"\nkey = \"key-b\"\n";

    /// Different keys on one shard each get their own client, in any order and again,
    /// and a wrong key, a key that only shares a prefix, the admin token or no key get
    /// what the index says.
    #[test]
    fn the_cache_answers_each_key_as_the_index_does() {
        let index = KeyIndex::new(&config(KEYS));
        let cache = KeyCache::default();
        let cases = [
            (Some("key-a"), Caller::Key(0)),
            (Some("key-b"), Caller::Key(1)),
            (Some("key-a"), Caller::Key(0)),
            (Some("key-"), Caller::Denied),
            (Some("key-ab"), Caller::Denied),
            (Some("key-c"), Caller::Denied),
            (Some("admin-token"), Caller::Admin),
            (None, Caller::Denied),
            (Some("key-b"), Caller::Key(1)),
            (Some("admin-token"), Caller::Admin),
        ];
        for (key, want) in cases {
            assert_eq!(cache.identify(&index, &head(key)), want, "{key:?}");
            assert_eq!(index.identify(&head(key)), want, "{key:?}");
        }
        // Only the two client keys were remembered: no denied guess, no admin token.
        assert_eq!(cache.entries.borrow().len(), 2);
    }

    /// A remembered key is answered without its digest: an index without that key (what a
    /// cache kept across a reload would see) still gets the remembered client, which is why
    /// each configuration generation has a cache of its own.
    #[test]
    fn a_remembered_key_is_answered_from_the_cache() {
        let cache = KeyCache::default();
        let before = KeyIndex::new(&config(KEYS));
        assert_eq!(
            cache.identify(&before, &head(Some("key-b"))),
            Caller::Key(1)
        );
        let revoked = KeyIndex::new(&config("[[client_keys]]\nid = \"a\"\nkey = \"key-a\"\n"));
        assert_eq!(revoked.identify(&head(Some("key-b"))), Caller::Denied);
        assert_eq!(
            cache.identify(&revoked, &head(Some("key-b"))),
            Caller::Key(1)
        );
        assert_eq!(
            KeyCache::default().identify(&revoked, &head(Some("key-b"))),
            Caller::Denied
        );
    }

    /// More keys than the cache holds: every one still identifies its client, the oldest
    /// entries give way, and the cache never grows past its bound.
    #[test]
    fn more_keys_than_slots_each_get_their_client() {
        let n = CACHED_KEYS * 2 + 3;
        let toml: String = (0..n)
            .map(|i| format!("[[client_keys]]\nid = \"k{i}\"\nkey = \"key-{i}\"\n\n"))
            .collect();
        let index = KeyIndex::new(&config(&toml));
        let cache = KeyCache::default();
        for round in 0..3 {
            for i in 0..n {
                let key = format!("key-{i}");
                assert_eq!(
                    cache.identify(&index, &head(Some(&key))),
                    Caller::Key(i),
                    "round {round}"
                );
            }
        }
        assert_eq!(cache.entries.borrow().len(), CACHED_KEYS);
    }

    /// The trim `presented_key` used before `bearer_key`: ASCII whitespace off both ends.
    fn trim_before(v: &[u8]) -> &[u8] {
        let start = v
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(v.len());
        let end = v
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(start, |e| e + 1);
        &v[start..end.max(start)]
    }

    /// What `presented_key` read of an `Authorization` value before `bearer_key`.
    fn bearer_key_before(v: &[u8]) -> Option<&[u8]> {
        let v = trim_before(v);
        if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
            let k = trim_before(&v[7..]);
            if !k.is_empty() {
                return Some(k);
            }
        }
        None
    }

    #[test]
    fn bearer_keys_read_as_before() {
        let cases: [&[u8]; 18] = [
            b"Bearer perf-key",
            b"bearer k",
            b"BEARER k",
            b"bEaReR  \t k \r",
            b" \tBearer k  ",
            b"Bearer ",
            b"Bearer  ",
            b"Bearer",
            b"Bearerk",
            b"Bearer\tk",
            b"Bearer\0k",
            b"Bearer\xc3k",
            b"Bearar k",
            b"Basic abc",
            b"",
            b"   ",
            b"\x02earer k",
            b"Bearer k\x0b",
        ];
        for v in cases {
            assert_eq!(
                bearer_key(v),
                bearer_key_before(v),
                "{:?}",
                v.escape_ascii()
            );
            assert_eq!(trim(v), trim_before(v));
        }
    }

    proptest::proptest! {
        /// Any value made of scheme letters in either case, whitespace, the bytes a
        /// case fold could confuse (NUL, `@`, `B` - 0x20, …) and key bytes reads as before.
        #[test]
        fn bearer_keys_read_as_before_on_any_value(
            v in proptest::collection::vec(
                proptest::sample::select(
                    b"bBeEaArR \t\r\n\x0b\x0c\0\x02\x05\x01\x12@`kK-\xc3\xe5".to_vec()
                ),
                0..14,
            )
        ) {
            proptest::prop_assert_eq!(bearer_key(&v), bearer_key_before(&v));
        }

        /// A value that starts with the scheme in any case: every such value reads as
        /// before (the sampled one above rarely spells it out).
        #[test]
        fn bearer_keys_after_the_scheme_read_as_before(
            upper in proptest::collection::vec(proptest::prelude::any::<bool>(), 6),
            lead in proptest::collection::vec(proptest::sample::select(b" \t".to_vec()), 0..3),
            rest in proptest::collection::vec(
                proptest::sample::select(b" \tk\0\x0bK".to_vec()),
                0..6,
            ),
        ) {
            let mut v = lead;
            for (c, up) in b"bearer".iter().zip(upper) {
                v.push(if up { c.to_ascii_uppercase() } else { *c });
            }
            v.push(b' ');
            v.extend(rest);
            proptest::prop_assert_eq!(bearer_key(&v), bearer_key_before(&v));
        }
    }

    #[test]
    fn same_bytes_needs_every_byte_and_the_length() {
        assert!(same_bytes(b"", b""));
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"abc", b"abd"));
        assert!(!same_bytes(b"abc", b"xbc"));
        assert!(!same_bytes(b"abc", b"ab"));
        assert!(!same_bytes(b"ab", b"abc"));
    }
}
