//! Client authentication: a key from `Authorization: Bearer` or `x-api-key`, looked up by
//! its SHA-256 digest (plain keys are hashed at start-up), so the lookup time says nothing
//! about how much of a guess was right.

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
        let Some(presented) = presented_key(head) else {
            return if self.is_open() {
                Caller::Open
            } else {
                Caller::Denied
            };
        };
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

/// The key a request presents: `Authorization: Bearer <k>` first, then `x-api-key`.
pub fn presented_key(head: &RequestHead) -> Option<&[u8]> {
    if let Some(v) = head.header("authorization") {
        let v = trim(v);
        if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
            let k = trim(&v[7..]);
            if !k.is_empty() {
                return Some(k);
            }
        }
    }
    head.header("x-api-key").map(trim).filter(|k| !k.is_empty())
}

fn trim(v: &[u8]) -> &[u8] {
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
