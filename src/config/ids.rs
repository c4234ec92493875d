//! Stable ids. Owner state (breakers, cooldowns, lockouts, gates, queues, pins, metrics) is
//! keyed by [`ProviderId`], [`ConnectionId`] and [`ComboId`], and an id decides which shard
//! owns the key. A file loaded at start numbers its providers, connections and combos by
//! position. A reload (`renumber::carry_ids`) gives every provider, connection and combo the
//! reloaded file keeps (same name) the id it had, and every new one an id never used before
//! in this process — so adding, removing or reordering entries moves no state to another
//! name, and a removed entry's id never comes back to mean something else. This file holds
//! the id types and the id → position map; `renumber` carries ids over a reload.
//!
//! Lists stay in file order (order matters: the first provider whose catalog has a bare
//! model serves it); [`Slots`] maps each id to its position.

/// A provider's id: its position in the file's `[[providers]]` when the file was first
/// loaded; a reload keeps the id of every provider it keeps (by name) and gives new ones
/// ids never used before. Owner state is keyed by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderId(pub u16);

/// A connection's id (stable across reloads like [`ProviderId`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionId(pub u32);

/// A combo's id (stable across reloads like [`ProviderId`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComboId(pub u16);

/// Marks an id with no entry in this configuration.
pub const NONE: u32 = u32::MAX;

/// Where each id sits in the configuration's lists (index = id).
#[derive(Clone, Debug, Default)]
pub struct Slots {
    providers: Vec<u32>,
    connections: Vec<u32>,
    combos: Vec<u32>,
}

fn slot(list: &[u32], id: usize) -> Option<usize> {
    match list.get(id) {
        Some(&NONE) | None => None,
        Some(&i) => Some(i as usize),
    }
}

/// `list` of length at least `bound` with `(id, position)` entered.
fn build(bound: usize, entries: impl Iterator<Item = (usize, usize)>) -> Vec<u32> {
    let mut list = vec![NONE; bound];
    for (id, pos) in entries {
        if list.len() <= id {
            list.resize(id + 1, NONE);
        }
        if let Some(s) = list.get_mut(id) {
            *s = u32::try_from(pos).unwrap_or(NONE);
        }
    }
    list
}

impl Slots {
    pub fn provider_slot(&self, id: ProviderId) -> Option<usize> {
        slot(&self.providers, usize::from(id.0))
    }

    pub fn connection_slot(&self, id: ConnectionId) -> Option<usize> {
        slot(&self.connections, id.0 as usize)
    }

    pub fn combo_slot(&self, id: ComboId) -> Option<usize> {
        slot(&self.combos, usize::from(id.0))
    }

    /// One more than the largest provider id ever given in this process (a table indexed
    /// by provider id has this many entries).
    pub fn provider_bound(&self) -> usize {
        self.providers.len()
    }

    /// One more than the largest connection id ever given in this process.
    pub fn connection_bound(&self) -> usize {
        self.connections.len()
    }

    /// Slots for lists whose entries have these ids (in list order), keeping `bound`'s id
    /// ranges reserved so that no id is given twice.
    pub fn new(
        providers: impl Iterator<Item = ProviderId>,
        connections: impl Iterator<Item = ConnectionId>,
        combos: impl Iterator<Item = ComboId>,
        bound: &Slots,
    ) -> Slots {
        Slots {
            providers: build(
                bound.providers.len(),
                providers.enumerate().map(|(i, p)| (usize::from(p.0), i)),
            ),
            connections: build(
                bound.connections.len(),
                connections.enumerate().map(|(i, c)| (c.0 as usize, i)),
            ),
            combos: build(
                bound.combos.len(),
                combos.enumerate().map(|(i, c)| (usize::from(c.0), i)),
            ),
        }
    }

    /// One more than the largest combo id ever given in this process.
    pub fn combo_bound(&self) -> usize {
        self.combos.len()
    }
}
