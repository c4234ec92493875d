//! Threads and lifecycle: the fleet of shards, each a pinned thread with its own runtime.

pub mod fleet;
