//! Health: the provider and connection breakers, connection state (cooldowns, backoff,
//! terminal states), model lockouts and the optional provider cooldown tracker of the keys a
//! shard owns, and the views of them every shard routes from. Owned by the connection's (or provider's) owner shard; fed by the
//! outcome of every attempt (`client::report`) and asked for half-open probe permits
//! (`client::admit`).

pub mod client;
pub mod owner;
pub mod protocol;
pub mod views;

pub use owner::Health;
