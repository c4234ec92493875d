//! Session affinity (B §4): a session's pin to a connection of each provider lives on the
//! session's owner shard (placement by its digest), so every shard routes the session to
//! the same connection. The asker sends the connections it may route to now; the owner
//! keeps or re-makes the pin (`routing::affinity::PinTable`) and answers with one. A
//! failover after a 429 on the pinned connection drops the pin. Fails open: an owner that
//! does not answer leaves the plan's own order.

pub mod client;
pub mod owner;
pub mod protocol;

pub use owner::Affinity;
