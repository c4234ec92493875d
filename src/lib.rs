//! Tidegate: a thread-per-core LLM API edge gateway.
//!
//! The module tree mirrors the layers of `docs/architecture.md`, imports running downward
//! only: ground floor (`clock`, `error`, `config`, `http1`); transport (`mesh`) and the
//! pure mechanisms (`resilience`, `flow`, `routing`) and wire formats (`providers`);
//! sockets (`net`, serving a handler it is given); the generic shard runtime (`shard`); the
//! owner-held mechanisms (`owners`); the request phases (`proxy`, `auth`, `admin`); and the
//! server that wires them (`server`).

pub mod admin;
pub mod auth;
pub mod clock;
pub mod config;
pub mod error;
pub mod flow;
pub mod http1;
pub mod mesh;
pub mod net;
pub mod owners;
pub mod providers;
pub mod proxy;
pub mod resilience;
pub mod routing;
pub mod server;
pub mod shard;
