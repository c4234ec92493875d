//! Claiming the listen address. The shards listen with `SO_REUSEPORT`, which would also let
//! a second process of the same user join the address and silently take a share of its
//! connections. So an address is claimed before the shards bind, and checked after:
//!
//! * **exclusive** (the default): a marker — an abstract Unix socket named after the
//!   address, `tidegate-listen/<addr>/exclusive` — is bound first (atomic: a second
//!   exclusive Tidegate fails right there); then a probe socket without `SO_REUSEPORT` binds
//!   the address (it fails while anyone listens there, whatever their options); after the
//!   shards bind, `/proc/net/tcp{,6}` must list no listening socket on an overlapping
//!   address that is not one of ours — this closes the window between the probe and the
//!   shards' bind for processes that are not Tidegate.
//! * **shared** (`server.allow_shared_listen = true`): the marker is
//!   `tidegate-listen/<addr>/shared/<pid>`. When the probe finds the address taken, it may be
//!   joined only if another shared marker for the same address exists; after binding, no
//!   exclusive marker may exist for an overlapping address (an exclusive instance that
//!   started meanwhile sees our sockets in its own check, or we see its marker — one of the
//!   two always refuses).
//!
//! Abstract sockets live in the network namespace, as the TCP port does, and vanish with
//! the process, so a crash leaves nothing stale. `listen = "…:0"` is never contended and
//! skips all of this.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};

use socket2::{Domain, Protocol, Socket, Type};

/// The message every refusal starts with.
pub const IN_USE: &str = "address in use by another process";

/// Marker name prefix (abstract namespace; `/proc/net/unix` shows it with a leading `@`).
const MARKER_PREFIX: &str = "tidegate-listen/";

/// TCP state `LISTEN` as `/proc/net/tcp` prints it.
const TCP_LISTEN: &str = "0A";

/// A held claim: keeps the marker socket open for the life of the process.
#[derive(Debug)]
pub struct Claim {
    _marker: Option<UnixListener>,
}

fn exclusive_name(addr: SocketAddr) -> String {
    format!("{MARKER_PREFIX}{addr}/exclusive")
}

fn shared_name(addr: SocketAddr) -> String {
    format!("{MARKER_PREFIX}{addr}/shared/{}", std::process::id())
}

fn bind_marker(name: &str) -> io::Result<UnixListener> {
    UnixListener::bind_addr(&UnixAddr::from_abstract_name(name.as_bytes())?)
}

/// Binds `addr` without `SO_REUSEPORT` (with `SO_REUSEADDR`, so connections of an earlier
/// run in TIME_WAIT do not count): fails with `AddrInUse` while any socket listens there.
fn probe(addr: SocketAddr) -> io::Result<()> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())
}

/// Claims `addr` before the shards bind. Errors are complete messages.
pub fn before_bind(addr: SocketAddr, shared: bool) -> Result<Claim, String> {
    if addr.port() == 0 {
        return Ok(Claim { _marker: None });
    }
    let marker = if shared {
        bind_marker(&shared_name(addr))
    } else {
        bind_marker(&exclusive_name(addr))
    };
    let marker = match marker {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            return Err(format!(
                "{IN_USE}: another Tidegate already serves {addr} (set \
                 server.allow_shared_listen = true on both for a handover)"
            ));
        }
        Err(e) => return Err(format!("cannot claim {addr}: {e}")),
    };
    match probe(addr) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            let others = markers()
                .into_iter()
                .filter(|m| m.addr == addr && m.shared && m.pid != Some(std::process::id()))
                .count();
            if !shared || others == 0 {
                let hint = if shared {
                    " (it is not a Tidegate with server.allow_shared_listen = true)"
                } else {
                    ""
                };
                return Err(format!("{IN_USE}: {addr} is taken{hint}"));
            }
        }
        // Permission or address problems surface again, with their reason, at the bind.
        Err(_) => {}
    }
    Ok(Claim {
        _marker: Some(marker),
    })
}

/// Checks, once the shards listen on `bound`, that no one else does (exclusive) or that
/// no exclusive Tidegate claimed an overlapping address meanwhile (shared).
pub fn after_bind(bound: SocketAddr, shared: bool, ours: &[TcpListener]) -> Result<(), String> {
    if shared {
        if let Some(m) = markers()
            .into_iter()
            .find(|m| !m.shared && overlaps(m.addr, bound))
        {
            return Err(format!(
                "{IN_USE}: a Tidegate without server.allow_shared_listen serves {}",
                m.addr
            ));
        }
        return Ok(());
    }
    let ours: Vec<u64> = ours.iter().filter_map(socket_inode).collect();
    let Some(listening) = listening_sockets() else {
        tracing::debug!("/proc/net/tcp is unreadable; the after-bind listen check is skipped");
        return Ok(());
    };
    match listening
        .iter()
        .find(|(addr, inode)| overlaps(*addr, bound) && !ours.contains(inode))
    {
        Some((addr, _)) => Err(format!(
            "{IN_USE}: another socket listens on {addr} as well"
        )),
        None => Ok(()),
    }
}

/// Two listen addresses overlap when their ports match and their IPs are equal or either
/// is a wildcard.
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// The inode of a socket, from `/proc/self/fd/<fd>` (`socket:[<inode>]`).
fn socket_inode(l: &TcpListener) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", l.as_raw_fd())).ok()?;
    let text = link.to_str()?;
    text.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Every listening TCP socket of this network namespace: (address, inode). `None` when
/// `/proc/net/tcp` cannot be read.
fn listening_sockets() -> Option<Vec<(SocketAddr, u64)>> {
    let v4 = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let v6 = std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
    Some(
        v4.lines()
            .chain(v6.lines())
            .skip_while(|l| l.trim_start().starts_with("sl"))
            .filter_map(parse_tcp_line)
            .collect(),
    )
}

/// One line of `/proc/net/tcp{,6}`, if it is a listening socket.
fn parse_tcp_line(line: &str) -> Option<(SocketAddr, u64)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(3) != Some(&TCP_LISTEN) {
        return None;
    }
    let (ip_hex, port_hex) = fields.get(1)?.split_once(':')?;
    let port = u16::from_str_radix(port_hex, 16).ok()?;
    let ip = parse_proc_ip(ip_hex)?;
    let inode = fields.get(9)?.parse().ok()?;
    Some((SocketAddr::new(ip, port), inode))
}

/// The kernel prints each 32-bit word of the address as a host-order number.
fn parse_proc_ip(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = hex.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(w, 16).ok()?.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(b);
            // A v4-mapped wildcard or address listens for IPv4 too.
            Some(match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            })
        }
        _ => None,
    }
}

/// A marker found in `/proc/net/unix`.
#[derive(Debug, PartialEq, Eq)]
struct Marker {
    addr: SocketAddr,
    shared: bool,
    pid: Option<u32>,
}

fn markers() -> Vec<Marker> {
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter_map(|path| path.strip_prefix('@'))
        .filter_map(parse_marker)
        .collect()
}

fn parse_marker(name: &str) -> Option<Marker> {
    let rest = name.strip_prefix(MARKER_PREFIX)?;
    let mut parts = rest.split('/');
    let addr = parts.next()?.parse().ok()?;
    match (parts.next()?, parts.next()) {
        ("exclusive", None) => Some(Marker {
            addr,
            shared: false,
            pid: None,
        }),
        ("shared", Some(pid)) => Some(Marker {
            addr,
            shared: true,
            pid: pid.parse().ok(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_lines_parse() {
        let v4 = "   1: 0100007F:2253 00000000:0000 0A 00000000:00000000 00:00000000 00000000  \
                  1000        0 123456 1 0000000000000000 100 0 0 10 0";
        assert_eq!(
            parse_tcp_line(v4),
            Some(("127.0.0.1:8787".parse().unwrap(), 123456))
        );
        let established = v4.replace(" 0A ", " 01 ");
        assert_eq!(parse_tcp_line(&established), None);
        let v6 = "   0: 00000000000000000000000001000000:2253 00000000000000000000000000000000:0000 \
                  0A 00000000:00000000 00:00000000 00000000  1000        0 99 1 0 100 0 0 10 0";
        assert_eq!(
            parse_tcp_line(v6),
            Some(("[::1]:8787".parse().unwrap(), 99))
        );
        assert!(parse_tcp_line("  sl  local_address rem_address   st").is_none());
    }

    #[test]
    fn markers_parse_and_addresses_overlap() {
        assert_eq!(
            parse_marker("tidegate-listen/127.0.0.1:8787/shared/42"),
            Some(Marker {
                addr: "127.0.0.1:8787".parse().unwrap(),
                shared: true,
                pid: Some(42)
            })
        );
        assert!(parse_marker("tidegate-listen/[::]:80/exclusive").is_some());
        assert!(parse_marker("other/127.0.0.1:1/exclusive").is_none());
        let a: SocketAddr = "0.0.0.0:80".parse().unwrap();
        assert!(overlaps(a, "10.0.0.1:80".parse().unwrap()));
        assert!(!overlaps(a, "10.0.0.1:81".parse().unwrap()));
        assert!(!overlaps(
            "10.0.0.2:80".parse().unwrap(),
            "10.0.0.1:80".parse().unwrap()
        ));
    }

    #[test]
    fn after_binding_another_reuseport_listener_is_seen() {
        let bind = |addr: SocketAddr| {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&addr.into()).unwrap();
            s.listen(8).unwrap();
            TcpListener::from(s)
        };
        let foreign = bind("127.0.0.1:0".parse().unwrap());
        let addr = foreign.local_addr().unwrap();
        let ours = bind(addr);
        let err = after_bind(addr, false, std::slice::from_ref(&ours)).unwrap_err();
        assert!(err.starts_with(IN_USE), "{err}");
        drop(foreign);
        after_bind(addr, false, std::slice::from_ref(&ours)).unwrap();
    }

    #[test]
    fn an_exclusive_claim_refuses_a_taken_port_and_a_second_claim() {
        // A plain listener (no SO_REUSEPORT) holds a port: the probe sees it.
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = other.local_addr().unwrap();
        let err = before_bind(addr, false).unwrap_err();
        assert!(err.starts_with(IN_USE), "{err}");
        drop(other);
        // A free port: claimed; a second exclusive claim meets the marker.
        let free = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let held = before_bind(free, false).unwrap();
        let err = before_bind(free, false).unwrap_err();
        assert!(err.starts_with(IN_USE), "{err}");
        drop(held);
        assert!(before_bind(free, false).is_ok());
    }
}
