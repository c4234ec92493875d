//! Tidegate: a thread-per-core LLM API edge gateway.
//!
//! The module tree mirrors the request flow and the state ownership laid out in
//! `ARCHITECTURE.md`: codecs are sans-IO (`http1`), mechanisms are pure state machines
//! over an injected clock (`clock`), every socket lives in `net`, and `proxy` runs the
//! phases of a request.

pub mod admin;
pub mod clock;
pub mod config;
pub mod error;
pub mod flow;
pub mod http1;
pub mod net;
pub mod providers;
pub mod proxy;
pub mod resilience;
pub mod routing;
pub mod runtime;
pub mod shard;
