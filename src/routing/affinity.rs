//! Session pins (spec B §4): which connection of a provider a session keeps using, and the
//! least-recently-used pick that makes a new pin. A pure table over an injected clock
//! (monotonic ms); it lives on the session's owner shard (`owners::affinity`), so every
//! shard gets the same answer for the same session.
//!
//! - A pin whose connection is among the eligible ones is used and its expiry extended by
//!   the TTL (touch).
//! - Otherwise (no pin, expired, or its connection not eligible) the pin is deleted and a
//!   fresh pick is made among the eligible connections — never-used ones first (by
//!   priority), then the oldest last use, then fewer consecutive uses, then priority, then
//!   the caller's order — and pinned.
//! - Uses are recorded per connection where the pin lives; a new pin is also announced to
//!   the other shards' tables ([`PinTable::note_use`]), so a new session anywhere avoids a
//!   connection another shard just pinned.
//! - The table holds at most [`MAX_PINS`] pins; when full, expired pins are swept (at most
//!   once per [`FULL_SWEEP_INTERVAL_MS`]) and a pick that still finds no room is answered
//!   without being stored.

use std::collections::HashMap;

use crate::config::{ConnectionId, ProviderId};

use super::session::SessionDigest;

/// At most this many pins per owner shard.
pub const MAX_PINS: usize = 200_000;
/// A full table sweeps expired pins at most this often.
pub const FULL_SWEEP_INTERVAL_MS: u64 = 1_000;
/// Expired pins are swept this often (besides being deleted when read).
pub const SWEEP_INTERVAL_MS: u64 = 5 * 60 * 1_000;

/// A connection the asker may route to now, with its configured priority (lower first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eligible {
    pub connection: ConnectionId,
    pub priority: u32,
}

/// One session's pin to a connection of one provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin {
    pub connection: ConnectionId,
    pub created_ms: u64,
    pub last_used_ms: u64,
    pub expires_ms: u64,
}

/// What [`PinTable::choose`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The existing pin, touched.
    Kept(ConnectionId),
    /// A fresh least-recently-used pick, now pinned (unless the table was full).
    Made(ConnectionId),
    /// Nothing is eligible: no pin (an old one is deleted).
    Nothing,
}

impl Choice {
    pub fn connection(self) -> Option<ConnectionId> {
        match self {
            Choice::Kept(c) | Choice::Made(c) => Some(c),
            Choice::Nothing => None,
        }
    }
}

/// How a connection has been used by the pins of this table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Usage {
    last_used_ms: u64,
    /// Uses in a row (no other connection of its provider chosen in between).
    consecutive: u32,
}

#[derive(Debug, Default)]
pub struct PinTable {
    pins: HashMap<(ProviderId, SessionDigest), Pin>,
    usage: HashMap<ConnectionId, Usage>,
    last_chosen: HashMap<ProviderId, ConnectionId>,
    last_full_sweep_ms: Option<u64>,
    last_sweep_ms: u64,
}

impl PinTable {
    /// The connection session `session` uses for `provider` now: its pin when eligible,
    /// else a fresh pick among `eligible` (in the caller's order for ties), pinned for
    /// `ttl_ms`.
    pub fn choose(
        &mut self,
        provider: ProviderId,
        session: SessionDigest,
        eligible: &[Eligible],
        ttl_ms: u64,
        now_ms: u64,
    ) -> Choice {
        let key = (provider, session);
        if let Some(pin) = self.pins.get_mut(&key) {
            let live = pin.expires_ms > now_ms;
            if live && eligible.iter().any(|e| e.connection == pin.connection) {
                pin.last_used_ms = now_ms;
                pin.expires_ms = now_ms.saturating_add(ttl_ms);
                let c = pin.connection;
                self.used(provider, c, now_ms);
                return Choice::Kept(c);
            }
            self.pins.remove(&key);
        }
        let Some(pick) = self.least_recently_used(eligible) else {
            return Choice::Nothing;
        };
        if self.pins.len() >= MAX_PINS {
            self.sweep_full(now_ms);
        }
        if self.pins.len() < MAX_PINS {
            self.pins.insert(
                key,
                Pin {
                    connection: pick,
                    created_ms: now_ms,
                    last_used_ms: now_ms,
                    expires_ms: now_ms.saturating_add(ttl_ms),
                },
            );
        }
        self.used(provider, pick, now_ms);
        Choice::Made(pick)
    }

    /// Drops the pins (and use records) of providers and connections `keep` refuses (a
    /// reload removed them): their sessions are pinned afresh.
    pub fn retain(
        &mut self,
        provider: impl Fn(ProviderId) -> bool,
        connection: impl Fn(ConnectionId) -> bool,
    ) {
        self.pins
            .retain(|(p, _), pin| provider(*p) && connection(pin.connection));
        self.last_chosen
            .retain(|p, c| provider(*p) && connection(*c));
        self.usage.retain(|c, _| connection(*c));
    }

    /// Deletes the pin of `session` for `provider` if it points to `connection` (a
    /// failover after a 429 on it, B §4). True when one was deleted.
    pub fn drop_pin(
        &mut self,
        provider: ProviderId,
        session: SessionDigest,
        connection: ConnectionId,
    ) -> bool {
        let key = (provider, session);
        if self
            .pins
            .get(&key)
            .is_some_and(|p| p.connection == connection)
        {
            self.pins.remove(&key);
            return true;
        }
        false
    }

    /// The pin of `session` for `provider`, if any (expired ones included).
    pub fn pin(&self, provider: ProviderId, session: SessionDigest) -> Option<Pin> {
        self.pins.get(&(provider, session)).copied()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pins.is_empty()
    }

    /// Puts back a pin a snapshot kept (start-up), counting its last use for the
    /// least-recently-used pick. Ignored when the table is full.
    pub fn adopt(&mut self, provider: ProviderId, session: SessionDigest, pin: Pin) {
        if self.pins.len() < MAX_PINS {
            self.pins.insert((provider, session), pin);
        }
        self.note_use(pin.connection, pin.last_used_ms);
    }

    /// Live pins at `now_ms`, and the distinct sessions they belong to.
    pub fn live_counts(&self, now_ms: u64) -> (usize, usize) {
        let mut sessions = std::collections::HashSet::new();
        let mut pins = 0;
        for ((_, session), p) in &self.pins {
            if p.expires_ms > now_ms {
                pins += 1;
                sessions.insert(*session);
            }
        }
        (pins, sessions.len())
    }

    /// Deletes expired pins when [`SWEEP_INTERVAL_MS`] has passed since the last sweep.
    pub fn sweep(&mut self, now_ms: u64) {
        if now_ms.saturating_sub(self.last_sweep_ms) >= SWEEP_INTERVAL_MS {
            self.last_sweep_ms = now_ms;
            self.pins.retain(|_, p| p.expires_ms > now_ms);
        }
    }

    fn sweep_full(&mut self, now_ms: u64) {
        let due = self
            .last_full_sweep_ms
            .is_none_or(|t| now_ms.saturating_sub(t) >= FULL_SWEEP_INTERVAL_MS);
        if due {
            self.last_full_sweep_ms = Some(now_ms);
            self.pins.retain(|_, p| p.expires_ms > now_ms);
        }
    }

    /// Another shard's table made a pin to `connection` at `at_ms`: it counts as a use for
    /// the least-recently-used pick here too (later uses win; consecutive counts stay
    /// local).
    pub fn note_use(&mut self, connection: ConnectionId, at_ms: u64) {
        let u = self.usage.entry(connection).or_default();
        u.last_used_ms = u.last_used_ms.max(at_ms);
    }

    fn used(&mut self, provider: ProviderId, connection: ConnectionId, now_ms: u64) {
        let again = self.last_chosen.insert(provider, connection) == Some(connection);
        let u = self.usage.entry(connection).or_default();
        u.last_used_ms = now_ms;
        u.consecutive = if again {
            u.consecutive.saturating_add(1)
        } else {
            1
        };
    }

    /// Never-used first (by priority), then the oldest last use, then fewer consecutive
    /// uses, then priority; ties keep the caller's order.
    fn least_recently_used(&self, eligible: &[Eligible]) -> Option<ConnectionId> {
        eligible
            .iter()
            .enumerate()
            .min_by_key(|(i, e)| {
                let usage = self.usage.get(&e.connection);
                let used = usage.is_some();
                let u = usage.copied().unwrap_or_default();
                (used, u.last_used_ms, u.consecutive, e.priority, *i)
            })
            .map(|(_, e)| e.connection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: ProviderId = ProviderId(0);
    const S: SessionDigest = [1; 32];
    const T: SessionDigest = [2; 32];

    fn e(c: u32, priority: u32) -> Eligible {
        Eligible {
            connection: ConnectionId(c),
            priority,
        }
    }

    #[test]
    fn a_pin_is_kept_and_touched_while_eligible() {
        let mut t = PinTable::default();
        let all = [e(0, 1), e(1, 1)];
        assert_eq!(
            t.choose(P, S, &all, 1_000, 0),
            Choice::Made(ConnectionId(0))
        );
        assert_eq!(
            t.choose(P, S, &all, 1_000, 900),
            Choice::Kept(ConnectionId(0))
        );
        // Touched at 900: still live at 1_800.
        assert_eq!(
            t.choose(P, S, &all, 1_000, 1_800),
            Choice::Kept(ConnectionId(0))
        );
        assert_eq!(t.pin(P, S).map(|p| p.expires_ms), Some(2_800));
    }

    #[test]
    fn new_sessions_go_to_the_least_recently_used_connection() {
        let mut t = PinTable::default();
        let all = [e(0, 5), e(1, 1), e(2, 1)];
        // Never used: by priority, then the caller's order.
        assert_eq!(
            t.choose(P, S, &all, 1_000, 0),
            Choice::Made(ConnectionId(1))
        );
        assert_eq!(
            t.choose(P, T, &all, 1_000, 1),
            Choice::Made(ConnectionId(2))
        );
        assert_eq!(
            t.choose(P, [3; 32], &all, 1_000, 2),
            Choice::Made(ConnectionId(0))
        );
        // All used: the oldest last use.
        assert_eq!(
            t.choose(P, [4; 32], &all, 1_000, 3),
            Choice::Made(ConnectionId(1))
        );
    }

    #[test]
    fn a_use_noted_from_elsewhere_counts_for_the_pick() {
        let mut t = PinTable::default();
        t.note_use(ConnectionId(0), 5);
        assert_eq!(
            t.choose(P, S, &[e(0, 1), e(1, 2)], 1_000, 10),
            Choice::Made(ConnectionId(1))
        );
        // An older use does not move the last use back.
        t.note_use(ConnectionId(1), 1);
        assert_eq!(
            t.choose(P, T, &[e(0, 1), e(1, 2)], 1_000, 11),
            Choice::Made(ConnectionId(0))
        );
    }

    #[test]
    fn a_pin_to_an_ineligible_connection_is_replaced() {
        let mut t = PinTable::default();
        assert_eq!(
            t.choose(P, S, &[e(0, 1), e(1, 1)], 1_000, 0),
            Choice::Made(ConnectionId(0))
        );
        assert_eq!(
            t.choose(P, S, &[e(1, 1)], 1_000, 1),
            Choice::Made(ConnectionId(1))
        );
        assert_eq!(t.pin(P, S).map(|p| p.connection), Some(ConnectionId(1)));
        // Nothing eligible: the pin goes.
        assert_eq!(t.choose(P, S, &[], 1_000, 2), Choice::Nothing);
        assert_eq!(t.pin(P, S), None);
    }

    #[test]
    fn an_expired_pin_is_not_used_and_drop_only_matches_its_connection() {
        let mut t = PinTable::default();
        let all = [e(0, 1), e(1, 1)];
        t.choose(P, S, &all, 100, 0);
        // Expired: a fresh pick (connection 1, never used).
        assert_eq!(
            t.choose(P, S, &all, 100, 200),
            Choice::Made(ConnectionId(1))
        );
        assert!(!t.drop_pin(P, S, ConnectionId(0)));
        assert!(t.drop_pin(P, S, ConnectionId(1)));
        assert!(t.is_empty());
        t.choose(P, S, &all, 100, 300);
        t.sweep(300 + SWEEP_INTERVAL_MS);
        assert!(t.is_empty());
    }
}
