//! Listening sockets: one `SO_REUSEPORT` socket per shard on the same address, so the
//! kernel spreads accepted connections across shards. All are bound up front on the main
//! thread, which lets `listen = "…:0"` resolve to one port shared by every shard.

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// Accept backlog of every listening socket.
pub const LISTEN_BACKLOG: i32 = 4096;

fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Binds `count` listeners on `addr`; when `addr` has port 0, the first bind picks the
/// port and the rest join it.
pub fn bind_shards(addr: SocketAddr, count: usize) -> io::Result<(SocketAddr, Vec<TcpListener>)> {
    let first = bind_one(addr)?;
    let bound = first.local_addr()?;
    let mut all = Vec::with_capacity(count);
    all.push(first);
    for _ in 1..count {
        all.push(bind_one(bound)?);
    }
    Ok((bound, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_zero_resolves_to_one_shared_port() {
        let (addr, ls) = bind_shards("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        assert_ne!(addr.port(), 0);
        assert_eq!(ls.len(), 3);
        for l in &ls {
            assert_eq!(l.local_addr().unwrap(), addr);
        }
    }
}
