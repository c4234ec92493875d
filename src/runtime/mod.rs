//! Threads and lifecycle: the fleet of shards, each a pinned thread with its own runtime;
//! the mesh that carries messages between them; who owns which key; and the views of
//! owner state every shard keeps.

pub mod fleet;
pub mod mesh;
pub mod msg;
pub mod outbox;
pub mod owner;
pub mod view;
