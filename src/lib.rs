//! Tidegate: a thread-per-core LLM API edge gateway.
//!
//! The module tree mirrors the request flow and the state ownership laid out in
//! `ARCHITECTURE.md`: codecs are sans-IO (`http1`), mechanisms are pure state machines
//! over an injected clock (`clock`), and every socket lives in `net`.

pub mod clock;
pub mod config;
pub mod error;
pub mod http1;
pub mod proxy;
