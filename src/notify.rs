//! The systemd readiness protocol (`sd_notify`), for `Type=notify` units: one datagram per
//! state change to the socket named by `NOTIFY_SOCKET` (a path, or an abstract name written
//! with a leading `@`). Without the variable — not run by systemd — it does nothing.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// Sends `state` (e.g. `READY=1`); failures are logged, never fatal.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os(NOTIFY_SOCKET_ENV) else {
        return;
    };
    let Some(target) = target.to_str() else {
        tracing::warn!("{NOTIFY_SOCKET_ENV} is not UTF-8; systemd is not told {state}");
        return;
    };
    if let Err(e) = send(target, state) {
        tracing::warn!("cannot tell systemd {state} through {target}: {e}");
    }
}

fn send(target: &str, state: &str) -> std::io::Result<()> {
    let addr = match target.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(target)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}
