//! Small I/O helpers over monoio's owned-buffer traits: appending reads into a
//! `BytesMut`, and one stream type for plain and TLS upstream connections.

use std::io;

use bytes::BytesMut;
use monoio::BufResult;
use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use monoio_rustls::{ClientTlsStream, ServerTlsStream};

/// Initial capacity of a connection's read buffer; it grows only when a message needs it.
pub const READ_BUF_BYTES: usize = 4 * 1024;

/// Reads more bytes into the spare capacity of `buf` (growing it by at least `min_spare`
/// when it is nearly full), appending after what it already holds. `Ok(0)` is EOF.
pub async fn read_more<S: AsyncReadRent>(
    s: &mut S,
    mut buf: BytesMut,
    min_spare: usize,
) -> (io::Result<usize>, BytesMut) {
    if buf.capacity() - buf.len() < min_spare {
        buf.reserve(min_spare);
    }
    let len = buf.len();
    let cap = buf.capacity();
    let (res, slice) = std::pin::pin!(s.read(buf.slice_mut(len..cap))).await;
    (res, slice.into_inner())
}

/// Writes the whole buffer, mapping a short write to an error.
pub async fn write_all<S: AsyncWriteRent, T: IoBuf + 'static>(s: &mut S, buf: T) -> io::Result<T> {
    // Pinned where it is made, here and in the reads and writes below: `.await` on the
    // future by value copied it (up to ~300 bytes) into the awaiting one, twice.
    let (res, buf) = std::pin::pin!(s.write_all(buf)).await;
    res.map(|_| buf)
}

/// A client connection: plain TCP, or TLS over TCP when the listener has a certificate.
///
/// The TLS stream's I/O futures are boxed: they are several times the plain socket's (a
/// write's: ~540 bytes against ~170), and inline they would size every read and write
/// future of every connection, plain ones included — and every request future that holds
/// one (an answer that streams holds it for minutes). TLS pays one allocation per I/O
/// call, next to its encryption. [`UpStream`] likewise.
pub enum ClientStream {
    Plain(TcpStream),
    /// The TLS stream and the client's address (read before the handshake).
    Tls(
        Box<ServerTlsStream<TcpStream>>,
        Option<std::net::SocketAddr>,
    ),
}

impl ClientStream {
    /// The client's address.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        match self {
            ClientStream::Plain(s) => s.peer_addr(),
            ClientStream::Tls(_, addr) => {
                addr.ok_or_else(|| io::Error::other("peer address unknown"))
            }
        }
    }

    /// Waits until the client sent something (or hung up). Over TLS this is not watched
    /// (the TCP socket is inside the TLS stream): it never resolves.
    pub async fn readable(&mut self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.readable(false).await,
            ClientStream::Tls(..) => std::future::pending().await,
        }
    }
}

impl AsyncReadRent for ClientStream {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => std::pin::pin!(s.read(buf)).await,
            ClientStream::Tls(s, _) => Box::pin(s.read(buf)).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => std::pin::pin!(s.readv(buf)).await,
            ClientStream::Tls(s, _) => Box::pin(s.readv(buf)).await,
        }
    }
}

impl AsyncWriteRent for ClientStream {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => std::pin::pin!(s.write(buf)).await,
            ClientStream::Tls(s, _) => Box::pin(s.write(buf)).await,
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => std::pin::pin!(s.writev(buf)).await,
            ClientStream::Tls(s, _) => Box::pin(s.writev(buf)).await,
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.flush().await,
            ClientStream::Tls(s, _) => Box::pin(s.flush()).await,
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.shutdown().await,
            ClientStream::Tls(s, _) => Box::pin(s.shutdown()).await,
        }
    }
}

/// An upstream byte stream: plain TCP or TLS over TCP (its TLS futures boxed, as
/// [`ClientStream`]'s).
pub enum UpStream {
    Plain(TcpStream),
    Tls(Box<ClientTlsStream<TcpStream>>),
}

impl AsyncReadRent for UpStream {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpStream::Plain(s) => std::pin::pin!(s.read(buf)).await,
            UpStream::Tls(s) => Box::pin(s.read(buf)).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpStream::Plain(s) => std::pin::pin!(s.readv(buf)).await,
            UpStream::Tls(s) => Box::pin(s.readv(buf)).await,
        }
    }
}

impl AsyncWriteRent for UpStream {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpStream::Plain(s) => std::pin::pin!(s.write(buf)).await,
            UpStream::Tls(s) => Box::pin(s.write(buf)).await,
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            UpStream::Plain(s) => std::pin::pin!(s.writev(buf)).await,
            UpStream::Tls(s) => Box::pin(s.writev(buf)).await,
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            UpStream::Plain(s) => s.flush().await,
            UpStream::Tls(s) => Box::pin(s.flush()).await,
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            UpStream::Plain(s) => s.shutdown().await,
            UpStream::Tls(s) => Box::pin(s.shutdown()).await,
        }
    }
}
