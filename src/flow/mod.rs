//! Flow control: per-connection request queues and their two time budgets, queue-depth
//! admission, the composite concurrency gate (global → provider → account → model) and
//! quota-share serialization. Pure state machines over an injected clock; permits and
//! queues live on the owner shard of their key.

pub mod admission;
pub mod gates;
pub mod queue;
pub mod quota_share;
