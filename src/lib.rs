//! Tidegate: a thread-per-core LLM API edge gateway.
//!
//! The module tree mirrors the layers of `docs/architecture.md`, imports running downward
//! only: ground floor (`clock`, `error`, `config`, `http1`, `heap`); the pure mechanisms
//! (`resilience`, `flow`, `routing`), wire formats (`providers`) and the client-key index
//! (`auth`); transport (`mesh`); sockets (`net`, serving a handler it is given); the generic
//! shard runtime (`shard`); the owner-held mechanisms (`owners`); the request phases
//! (`proxy`, `admin`); and the server that wires them (`server`), with `notify` telling
//! systemd when it is ready and when it stops. `scripts/check-structure` keeps it so (rules
//! in `scripts/structure.rules`).

pub mod admin;
pub mod auth;
pub mod clock;
pub mod config;
pub mod error;
pub mod flow;
pub mod heap;
pub mod http1;
pub mod mesh;
pub mod net;
pub mod notify;
pub mod owners;
pub mod providers;
pub mod proxy;
pub mod resilience;
pub mod routing;
pub mod server;
pub mod shard;
pub mod snapshot;
pub mod sse;
pub mod timer;
