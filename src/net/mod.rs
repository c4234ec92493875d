//! Every socket of the gateway: client connections (`downstream`), listening sockets,
//! the upstream client and its pool, TLS, name resolution, and the sweep that
//! keeps client reads' deadlines.

pub mod claim;
pub mod dns;
pub mod downstream;
pub mod io;
pub mod listener;
pub mod tls;
pub mod upstream;
pub mod watch;
