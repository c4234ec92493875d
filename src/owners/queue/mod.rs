//! Queue: the per-connection request queues (limiters with their queue-wait budget,
//! spacing, learning and wedge watchdog) and the provider sliding windows of the
//! connections this shard owns (spec B §1). An attempt takes a slot (`client::acquire`);
//! the guard returns it exactly once, with what a successful answer taught.

pub mod client;
pub mod owner;
pub mod protocol;

pub use owner::Queue;
