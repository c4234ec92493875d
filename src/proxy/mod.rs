//! The request path: one function per phase of the flow in `ARCHITECTURE.md` §2.

pub mod peek;
