//! The crash-safe snapshot (ARCHITECTURE §5 "Persistence"): what survives a restart —
//! circuit breakers, connection states (cooldowns, backoff levels, terminal states, last
//! errors), the provider cooldown tracker's entries, session affinity pins, PATCHed
//! settings and exclusive session leases. Model lockouts are not persisted (the guide keeps
//! them in memory).
//!
//! * `schema` — the sections and their records (rkyv archives, named by config ids).
//! * `file` — the file format, sans-IO: header (magic, schema version, bounded length,
//!   checksums) and tagged sections; decoding validates every archive.
//! * `store` — the two slot files on disk: atomic writes, memory-mapped reads, moving an
//!   untrusted file aside.
//! * `state` — the records by the process's ids, owner deltas, and the mapping to names.
//! * `writer` — the thread that merges deltas and writes, never on a shard.
//! * `inspect` — `tidegate snapshot inspect` as JSON.
//!
//! How a shard feeds the writer and adopts what was loaded is in `owners::health::owner`
//! (`snapshot_delta`, `restore`) and `server.rs`; `docs/operations.md` is the operator's
//! view.

pub mod file;
pub mod inspect;
pub mod schema;
pub mod state;
pub mod store;
pub mod writer;
