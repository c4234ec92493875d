//! Dynamic tool limits: what upstream answers taught about how many tools a provider's
//! model takes. The shard that sees such an answer tells every shard (itself included);
//! each keeps a replica (`resilience::tool_limit::ToolLimits`) that selection reads
//! locally, so a limit learned on one shard steers requests on all of them. Merging is
//! idempotent (lower threshold, later end), so order and duplicates do not matter.

pub mod client;
pub mod owner;
pub mod protocol;

pub use owner::ToolLimitTable;
