//! Host name resolution off the shard thread. The system resolver blocks, so a cache
//! miss resolves on a short-lived helper thread while the shard keeps serving; answers
//! are cached per shard for `DNS_TTL_MS`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// How long a resolved address list is reused.
pub const DNS_TTL_MS: u64 = 60_000;

/// Addresses of a (host, port) and the monotonic ms until which they are trusted.
type Entry = (Vec<SocketAddr>, u64);

#[derive(Debug, Default)]
pub struct DnsCache {
    entries: RefCell<HashMap<(String, u16), Entry>>,
}

impl DnsCache {
    /// Resolves `host:port`; `now_ms` is monotonic milliseconds.
    pub async fn resolve(&self, host: &str, port: u16, now_ms: u64) -> io::Result<Vec<SocketAddr>> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let key = (host.to_owned(), port);
        if let Some((addrs, until)) = self.entries.borrow().get(&key)
            && *until > now_ms
        {
            return Ok(addrs.clone());
        }
        let (tx, rx) = flume::bounded(1);
        let name = host.to_owned();
        std::thread::Builder::new()
            .name("tidegate-dns".into())
            .spawn(move || {
                let res = (name.as_str(), port)
                    .to_socket_addrs()
                    .map(|it| it.collect::<Vec<_>>());
                let _ = tx.send(res);
            })?;
        let addrs = rx
            .recv_async()
            .await
            .map_err(|_| io::Error::other("resolver thread ended without an answer"))??;
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{host} has no address"),
            ));
        }
        self.entries
            .borrow_mut()
            .insert(key, (addrs.clone(), now_ms + DNS_TTL_MS));
        Ok(addrs)
    }
}
