//! The encoder: response heads to clients, request heads to upstreams, and chunk framing.
//! It owns the guarantee that nothing the gateway writes can split a message: framing
//! fields are written only from [`Framing`], and a field that could inject a line is dropped.

use bytes::{BufMut, BytesMut};

use super::head::{is_field_value_byte, is_tchar};

/// How the body after a written head is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length: n`.
    Length(u64),
    /// `Transfer-Encoding: chunked`; write the body with [`write_chunk`] and [`write_last_chunk`].
    Chunked,
    /// No body follows (HEAD, 204, 304); no length field is written.
    NoBody,
    /// The body ends when the connection closes; no length field, and `Connection: close`.
    Close,
}

/// What a response says about its client connection (RFC 9112 §9.3): the request's
/// keep-alive (its version and `Connection` field), as the gateway decided it when the
/// head is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persist {
    /// The connection closes after this response: `Connection: close` is written.
    Close,
    /// Persistent as HTTP/1.1 is by default: nothing is written.
    KeepAlive,
    /// Persistent because an HTTP/1.0 request asked for it with `Connection: keep-alive`:
    /// the response says `Connection: keep-alive` (RFC 9112 §9.3, RFC 7230 appendix
    /// A.1.2), without which an HTTP/1.0 client must take the connection as closing.
    Echo,
}

impl Persist {
    /// Does the connection stay open after the response?
    pub fn is_kept(self) -> bool {
        self != Persist::Close
    }

    /// `self` while `keep` holds, else [`Persist::Close`].
    #[must_use]
    pub fn and(self, keep: bool) -> Self {
        if keep { self } else { Persist::Close }
    }
}

/// The interim answer to `Expect: 100-continue`.
pub const CONTINUE_100: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The RFC 9110 reason phrase of `status`; empty for an unregistered code (the status line
/// then ends in `"<status> "`, which RFC 9112 §4 allows).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        102 => "Processing",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        207 => "Multi-Status",
        208 => "Already Reported",
        226 => "IM Used",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        305 => "Use Proxy",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        423 => "Locked",
        424 => "Failed Dependency",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        506 => "Variant Also Negotiates",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        510 => "Not Extended",
        511 => "Network Authentication Required",
        _ => "",
    }
}

/// Hop-by-hop fields (RFC 9110 §7.6.1, plus the legacy `Keep-Alive`, `Proxy-Connection` and
/// proxy auth fields) that a proxy must not forward. The encoder itself drops only the
/// framing fields; callers filter with this.
pub fn is_hop_by_hop_name(name: &[u8]) -> bool {
    let is = |h: &[u8]| name.eq_ignore_ascii_case(h);
    // By length first: a relayed response's every field name is asked about.
    match name.len() {
        2 => is(b"te"),
        7 => is(b"trailer") || is(b"upgrade"),
        10 => is(b"connection") || is(b"keep-alive"),
        16 => is(b"proxy-connection"),
        17 => is(b"transfer-encoding"),
        18 => is(b"proxy-authenticate"),
        19 => is(b"proxy-authorization"),
        _ => false,
    }
}

/// The lengths of `names` as a bit set, for [`is_listed`]; every name is shorter than 64.
pub const fn name_lengths(names: &[&str]) -> u64 {
    let mut set = 0u64;
    let mut i = 0;
    while i < names.len() {
        let n = names[i].len();
        assert!(n < 64, "a listed field name is shorter than 64 bytes");
        set |= 1 << n;
        i += 1;
    }
    set
}

/// Is `name` one of `names` (ASCII case-insensitive)? `lengths` is `name_lengths(names)`:
/// a name of a length none of them has (most fields, checked on every field of every
/// request) is answered by one bit test instead of a compare per listed name.
pub fn is_listed(name: &[u8], names: &[&str], lengths: u64) -> bool {
    name.len() < 64
        && lengths & (1 << name.len()) != 0
        && names
            .iter()
            .any(|n| n.as_bytes().eq_ignore_ascii_case(name))
}

/// Writes `HTTP/1.1 <status> <reason>`, the fields, the framing field, the `Connection`
/// field `persist` calls for (`close` for [`Persist::Close`] and always for
/// [`Framing::Close`], `keep-alive` for [`Persist::Echo`], none for
/// [`Persist::KeepAlive`]), and the empty line.
///
/// Fields named `Content-Length`, `Transfer-Encoding` or `Connection` are dropped (framing is
/// only ever written from `framing`), and so is any field whose name is not a token or whose
/// value holds a byte outside HTAB / SP / VCHAR / obs-text (CR, LF, NUL and other controls).
/// A status outside 100..=999 cannot be written as three digits and is written as 500.
pub fn write_response_head<'a>(
    dst: &mut BytesMut,
    status: u16,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    framing: Framing,
    persist: Persist,
) {
    write_response_head_bytes(
        dst,
        status,
        headers.into_iter().map(|(n, v)| (n.as_bytes(), v)),
        framing,
        persist,
    );
}

/// [`write_response_head`] with field names as bytes (a relay passing on the names it
/// read, which are tokens, needs no `&str` of each).
pub fn write_response_head_bytes<'a>(
    dst: &mut BytesMut,
    status: u16,
    headers: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    framing: Framing,
    persist: Persist,
) {
    let status = if (100..=999).contains(&status) {
        status
    } else {
        500
    };
    dst.reserve(256);
    dst.put_slice(&status_line_start(status));
    dst.put_slice(reason_phrase(status).as_bytes());
    dst.put_slice(b"\r\n");
    for (name, value) in headers {
        put_field(dst, name, &[], value, false);
    }
    match framing {
        Framing::Length(n) => put_content_length(dst, n),
        Framing::Chunked => dst.put_slice(b"Transfer-Encoding: chunked\r\n"),
        Framing::NoBody | Framing::Close => {}
    }
    match persist {
        Persist::Close => dst.put_slice(b"Connection: close\r\n"),
        _ if framing == Framing::Close => dst.put_slice(b"Connection: close\r\n"),
        Persist::KeepAlive => {}
        Persist::Echo => dst.put_slice(b"Connection: keep-alive\r\n"),
    }
    dst.put_slice(b"\r\n");
}

/// [`write_request_head_parts`] with the target in one piece, the host without a port and
/// every field value in one piece.
#[cfg(test)]
pub fn write_request_head<'a>(
    dst: &mut BytesMut,
    method: &str,
    target: &str,
    host: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    framing: Framing,
) {
    write_request_head_parts(
        dst,
        method,
        &[target],
        host,
        None,
        headers
            .into_iter()
            .map(|(n, v)| (n.as_bytes(), &b""[..], v)),
        framing,
    );
}

/// Writes `<METHOD> <target> HTTP/1.1`, `Host: <host>[:<port>]`, the fields (dropping as in
/// [`write_response_head`], and `Host` too), the framing field and the empty line. Upstream
/// connections are always keep-alive, so no `Connection` field is written.
///
/// The target is the concatenation of `target`'s pieces and each field's value is its two
/// pieces `(name, prefix, value)` one after the other, so callers never join strings first;
/// a field is checked (and dropped) as the whole value.
///
/// Nothing here can split the request line: bytes of `method` that are not `tchar` and bytes
/// of `host` outside visible ASCII are skipped, and bytes of `target` outside visible ASCII
/// are percent-encoded (an empty target is `/`). A request has no close-delimited body:
/// [`Framing::Close`] is treated as [`Framing::NoBody`], which for POST, PUT and PATCH writes
/// `Content-Length: 0` (RFC 9110 §8.6).
pub fn write_request_head_parts<'a>(
    dst: &mut BytesMut,
    method: &str,
    target: &[&str],
    host: &str,
    port: Option<u16>,
    headers: impl IntoIterator<Item = (&'a [u8], &'a [u8], &'a [u8])>,
    framing: Framing,
) {
    let target_len: usize = target.iter().map(|t| t.len()).sum();
    dst.reserve(256 + target_len);
    for &b in method.as_bytes() {
        if is_tchar(b) {
            dst.put_u8(b);
        }
    }
    dst.put_u8(b' ');
    if target_len == 0 {
        dst.put_u8(b'/');
    }
    for part in target {
        let part = part.as_bytes();
        if part.iter().all(|b| (b'!'..=b'~').contains(b)) {
            dst.put_slice(part);
            continue;
        }
        for &b in part {
            if (b'!'..=b'~').contains(&b) {
                dst.put_u8(b);
            } else {
                put_percent(dst, b);
            }
        }
    }
    dst.put_slice(b" HTTP/1.1\r\nHost: ");
    let host = host.as_bytes();
    if host.iter().all(|b| (b'!'..=b'~').contains(b)) {
        dst.put_slice(host);
    } else {
        for &b in host {
            if (b'!'..=b'~').contains(&b) {
                dst.put_u8(b);
            }
        }
    }
    if let Some(port) = port {
        dst.put_u8(b':');
        put_decimal(dst, u64::from(port));
    }
    dst.put_slice(b"\r\n");
    put_fields(dst, headers, true);
    match framing {
        Framing::Length(n) => put_content_length(dst, n),
        Framing::Chunked => dst.put_slice(b"Transfer-Encoding: chunked\r\n"),
        Framing::NoBody | Framing::Close => {
            if matches!(method, "POST" | "PUT" | "PATCH") {
                dst.put_slice(b"Content-Length: 0\r\n");
            }
        }
    }
    dst.put_slice(b"\r\n");
}

/// Writes one chunk (`<hex len>\r\n<data>\r\n`). Empty `data` writes nothing: an empty chunk
/// would end the body.
pub fn write_chunk(dst: &mut BytesMut, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    dst.reserve(data.len() + 20);
    put_hex(dst, data.len() as u64);
    dst.put_slice(b"\r\n");
    dst.put_slice(data);
    dst.put_slice(b"\r\n");
}

/// Ends a chunked body (no trailers).
pub fn write_last_chunk(dst: &mut BytesMut) {
    dst.put_slice(b"0\r\n\r\n");
}

fn put_fields<'a>(
    dst: &mut BytesMut,
    headers: impl IntoIterator<Item = (&'a [u8], &'a [u8], &'a [u8])>,
    drop_host: bool,
) {
    for (name, prefix, value) in headers {
        put_field(dst, name, prefix, value, drop_host);
    }
}

/// One field (its value in two pieces), unless it is dropped (see [`write_response_head`]).
fn put_field(dst: &mut BytesMut, name: &[u8], prefix: &[u8], value: &[u8], drop_host: bool) {
    if droppable(name, drop_host)
        || name.is_empty()
        || !all_bytes(name, is_tchar)
        || !all_bytes(prefix, is_field_value_byte)
        || !all_bytes(value, is_field_value_byte)
    {
        return;
    }
    dst.reserve(name.len() + prefix.len() + value.len() + 4);
    dst.put_slice(name);
    dst.put_slice(b": ");
    if !prefix.is_empty() {
        dst.put_slice(prefix);
    }
    dst.put_slice(value);
    dst.put_slice(b"\r\n");
}

/// The framing fields (and `Host` in a request) are only ever written by the encoder itself.
fn droppable(name: &[u8], drop_host: bool) -> bool {
    match name.len() {
        4 => drop_host && name.eq_ignore_ascii_case(b"host"),
        10 => name.eq_ignore_ascii_case(b"connection"),
        14 => name.eq_ignore_ascii_case(b"content-length"),
        17 => name.eq_ignore_ascii_case(b"transfer-encoding"),
        _ => false,
    }
}

/// Does every byte pass `ok`? Without an early exit, so the loop vectorises: fields are
/// short and almost always valid.
fn all_bytes(bytes: &[u8], ok: impl Fn(u8) -> bool) -> bool {
    bytes.iter().fold(true, |all, &b| all & ok(b))
}

/// `HTTP/1.1 <status> ` for a status of three digits (100..=999).
fn status_line_start(status: u16) -> [u8; 13] {
    let digit = |n: u16| b'0' + (n % 10) as u8;
    let mut line = *b"HTTP/1.1 000 ";
    line[9] = digit(status / 100);
    line[10] = digit(status / 10);
    line[11] = digit(status);
    line
}

const CONTENT_LENGTH_NAME: &[u8; 16] = b"Content-Length: ";

/// `Content-Length: <n>` and its CRLF, put in one piece: built right to left in a buffer
/// that fits the longest (a `u64` has at most 20 digits).
fn put_content_length(dst: &mut BytesMut, mut n: u64) {
    let mut line = [0u8; CONTENT_LENGTH_NAME.len() + 20 + 2];
    let mut at = line.len() - 2;
    if let Some(end) = line.get_mut(at..) {
        end.copy_from_slice(b"\r\n");
    }
    loop {
        at -= 1;
        if let Some(slot) = line.get_mut(at) {
            *slot = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == CONTENT_LENGTH_NAME.len() {
            break;
        }
    }
    at -= CONTENT_LENGTH_NAME.len();
    if let Some(name) = line.get_mut(at..at + CONTENT_LENGTH_NAME.len()) {
        name.copy_from_slice(CONTENT_LENGTH_NAME);
    }
    dst.put_slice(line.get(at..).unwrap_or_default());
}

fn put_decimal(dst: &mut BytesMut, mut n: u64) {
    let mut digits = [0u8; 20]; // u64::MAX has 20 digits
    let mut at = digits.len();
    loop {
        at -= 1;
        if let Some(slot) = digits.get_mut(at) {
            *slot = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    dst.put_slice(digits.get(at..).unwrap_or_default());
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn put_hex(dst: &mut BytesMut, mut n: u64) {
    let mut digits = [0u8; 16]; // u64::MAX has 16 hex digits
    let mut at = digits.len();
    loop {
        at -= 1;
        if let (Some(slot), Some(&d)) = (digits.get_mut(at), HEX.get((n & 0xF) as usize)) {
            *slot = d;
        }
        n >>= 4;
        if n == 0 || at == 0 {
            break;
        }
    }
    dst.put_slice(digits.get(at..).unwrap_or_default());
}

fn put_percent(dst: &mut BytesMut, b: u8) {
    let hi = HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0');
    let lo = HEX.get(usize::from(b & 0xF)).copied().unwrap_or(b'0');
    dst.put_slice(&[b'%', hi, lo]);
}
