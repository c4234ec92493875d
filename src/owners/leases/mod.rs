//! Exclusive session leases (B §5): an owner process reserves one connection for itself.
//! A lease is unique over two keys at once (one active lease per connection, one per
//! owner), so every lease lives on one lease-owner shard, shard 0 (ARCHITECTURE §3), over
//! the pure table `routing::lease::LeaseTable`. Every action is a call to it, answered at
//! once; an asker whose call is not answered in time gets 503
//! `LEASE_SERVICE_UNAVAILABLE`, never a silent pass.

pub mod client;
pub mod owner;
pub mod protocol;

pub use owner::Leases;
