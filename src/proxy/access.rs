//! The access log: one line per request, written when its response is done, with the
//! request id (the client's `x-request-id`, or one made here) that the response carries.
//! The fields are filled in as the phases decide them; unknown ones log as `-`. A
//! request refused early logs what was known when it was refused: the key once it was
//! identified, the model once the body was peeked (a model no route serves included).

use std::cell::{Cell, RefCell};

use crate::config::Config;
use crate::error::GatewayError;
use crate::http1::RequestHead;
use crate::owners::{Req, Shard};

/// Request header read (and response header written) for the request id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Longest client-sent request id kept; a longer or unprintable one is replaced.
const MAX_REQUEST_ID: usize = 128;

/// Response fields a browser script may read.
const CORS_EXPOSE: &str = "x-request-id, x-tidegate-error, x-tidegate-provider, \
     x-tidegate-attempts, x-omniroute-selected-connection-id, retry-after";

/// The `Access-Control-Allow-Origin` value for a request: its `Origin` when
/// `server.cors_allow_origins` lists it, `*` when the list has `"*"`; else none.
pub fn cors_origin(config: &Config, head: &RequestHead) -> Option<String> {
    let allowed = &config.server.cors_allow_origins;
    if allowed.is_empty() {
        return None;
    }
    let origin = head
        .header("origin")
        .and_then(|v| std::str::from_utf8(v).ok())?;
    if allowed.iter().any(|a| a == "*") {
        return Some("*".to_owned());
    }
    allowed
        .iter()
        .any(|a| a.eq_ignore_ascii_case(origin))
        .then(|| origin.to_owned())
}

/// A request id: the client's (at most [`MAX_REQUEST_ID`] printable ASCII bytes) or one
/// made here, kept in place (no allocation per request). Its bytes are ASCII by
/// construction, so they are written out as they are; only the access line reads them
/// as a `str`.
#[derive(Clone)]
pub struct RequestId {
    bytes: [u8; MAX_REQUEST_ID],
    /// At most [`MAX_REQUEST_ID`].
    len: usize,
}

impl RequestId {
    /// The client's id: 1 to [`MAX_REQUEST_ID`] printable ASCII bytes, else `None`.
    fn given(v: &[u8]) -> Option<Self> {
        if v.is_empty() || v.len() > MAX_REQUEST_ID || !v.iter().all(u8::is_ascii_graphic) {
            return None;
        }
        let mut id = Self {
            bytes: [0; MAX_REQUEST_ID],
            len: v.len(),
        };
        id.bytes[..v.len()].copy_from_slice(v);
        Some(id)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// `tg-<wall ms>-<sequence>`, both in lower-case hex: the id of a request that brought
/// none. Written straight into the id's own bytes, eight digits per word: `format!` here
/// was ~2 % of a proxied request's instructions (callgrind, session 7), pushing `char`s
/// ~0.5 %, and a stack buffer written digit by digit, checked by `from_utf8` and copied
/// byte by byte into a `heapless::String` ~330 instructions (session 11).
fn made_id(wall_ms: u64, seq: u64) -> RequestId {
    let mut id = RequestId {
        bytes: [0; MAX_REQUEST_ID],
        len: 0,
    };
    let buf = &mut id.bytes;
    buf[..3].copy_from_slice(b"tg-");
    let mut n = put_hex(buf, 3, wall_ms);
    buf[n] = b'-';
    n = put_hex(buf, n + 1, seq);
    // At most 3 + 16 + 1 + 16 = 36 bytes (`put_hex` writes 16 from 4 + 16 at most).
    id.len = n;
    id
}

/// Writes `n` in lower-case hex without leading zeros (`0` for zero), as `{:x}` writes it,
/// at `buf[at..]`; returns where it ended. `buf` has room for 16 bytes from `at`: all 16
/// are written (the digits, then `0`s for the caller to write over or leave past the end).
fn put_hex(buf: &mut [u8], at: usize, n: u64) -> usize {
    let digits = (64 - n.leading_zeros()).div_ceil(4).max(1) as usize;
    // The digits moved to the top, so the 16 written start with them (a fixed-size copy).
    let top = n << (4 * (16 - digits));
    buf[at..at + 8].copy_from_slice(&hex8((top >> 32) as u32));
    buf[at + 8..at + 16].copy_from_slice(&hex8(top as u32));
    at + digits
}

/// The 8 lower-case hex digits of `v`, most significant first, computed in one word: each
/// nibble spread into a byte of its own, then `0` added to each and `a` - `0` - 10 more to
/// those of 10 or more (no byte carries into the next: each stays below 0x67).
fn hex8(v: u32) -> [u8; 8] {
    let mut x = u64::from(v);
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // Byte k holds nibble k: the big-endian bytes read most significant first.
    let letters = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    (x + 0x3030_3030_3030_3030 + letters * u64::from(b'a' - b'0' - 10)).to_be_bytes()
}

/// The fields every response to a request carries (see [`AccessLog::response_headers`]).
pub type ResponseFields<'a> = heapless::Vec<(&'static str, &'a [u8]), 4>;

/// What one request did, for its access-log line.
pub struct AccessLog {
    pub id: RequestId,
    /// `Access-Control-Allow-Origin` for this request's responses (`server.cors_allow_origins`
    /// matched its `Origin`).
    pub cors_origin: Option<String>,
    start_ns: u64,
    /// The `access` target is on: the line will be written, so the fields below are kept
    /// (when it is off, as by default, a request builds none of their strings).
    on: bool,
    /// Client key id (`None`: no key, or not identified).
    key: RefCell<Option<String>>,
    model: RefCell<Option<String>>,
    combo: RefCell<Option<String>>,
    provider: RefCell<Option<String>>,
    connection: RefCell<Option<String>>,
    attempts: Cell<usize>,
    status: Cell<u16>,
    bytes: Cell<u64>,
    first_byte_ns: Cell<Option<u64>>,
    error: Cell<Option<&'static str>>,
}

impl AccessLog {
    pub fn new(shard: &Req<'_>, head: &RequestHead) -> Self {
        Self::under(shard, shard.config(), head)
    }

    /// The log of a request read under `config` (a request refused while its body was
    /// read has no [`Req`] of its own here: the shard's current configuration).
    pub fn under(shard: &Shard, config: &Config, head: &RequestHead) -> Self {
        let now = shard.now();
        let given = head.header(REQUEST_ID_HEADER).and_then(RequestId::given);
        let id = match given {
            Some(id) => id,
            None => made_id(now.wall_ms, shard.next_seq()),
        };
        Self {
            id,
            cors_origin: cors_origin(config, head),
            start_ns: now.mono_ns,
            on: tracing::enabled!(target: "access", tracing::Level::INFO),
            key: RefCell::new(None),
            model: RefCell::new(None),
            combo: RefCell::new(None),
            provider: RefCell::new(None),
            connection: RefCell::new(None),
            attempts: Cell::new(0),
            status: Cell::new(0),
            bytes: Cell::new(0),
            first_byte_ns: Cell::new(None),
            error: Cell::new(None),
        }
    }

    /// The fields every response to this request carries: the request id, and the CORS
    /// fields when its origin is allowed.
    pub fn response_headers(&self) -> ResponseFields<'_> {
        let mut h = ResponseFields::new();
        // Four slots: these pushes cannot fail.
        let _ = h.push((REQUEST_ID_HEADER, self.id.as_bytes()));
        if let Some(origin) = &self.cors_origin {
            let _ = h.push(("access-control-allow-origin", origin.as_bytes()));
            let _ = h.push(("access-control-expose-headers", CORS_EXPOSE.as_bytes()));
            let _ = h.push(("vary", b"origin"));
        }
        h
    }

    pub fn key(&self, id: &str) {
        if self.on {
            *self.key.borrow_mut() = Some(id.to_owned());
        }
    }

    /// The model the body names (known once it is peeked, before it is resolved).
    pub fn model(&self, model: &str) {
        if self.on {
            *self.model.borrow_mut() = Some(model.to_owned());
        }
    }

    /// The model resolved to this combo.
    pub fn combo(&self, name: &str) {
        if self.on {
            *self.combo.borrow_mut() = Some(name.to_owned());
        }
    }

    /// The answer comes from `provider`/`connection` after `attempts` upstream attempts.
    pub fn upstream(&self, provider: &str, connection: &str, attempts: usize) {
        if self.on {
            *self.provider.borrow_mut() = Some(provider.to_owned());
            *self.connection.borrow_mut() = Some(connection.to_owned());
        }
        self.attempts.set(attempts);
    }

    pub fn attempts(&self, attempts: usize) {
        self.attempts.set(attempts);
    }

    /// The response head is about to be written: `ttfb_ms` ends here. Read from the clock
    /// itself, not the poll's one reading: an answer made in-process (the `mock` format)
    /// is written in the poll its request started in, and showed `ttfb_ms=0.0`.
    pub fn responding(&self, shard: &Shard, status: u16) {
        self.status.set(status);
        if self.on && self.first_byte_ns.get().is_none() {
            self.first_byte_ns.set(Some(shard.exact_mono_ns()));
        }
    }

    pub fn sent(&self, bytes: usize) {
        self.bytes
            .set(self.bytes.get().saturating_add(bytes as u64));
    }

    /// A gateway-made error answer.
    pub fn failed(&self, shard: &Shard, err: &GatewayError) {
        self.responding(shard, err.kind.status());
        self.error.set(Some(err.kind.code()));
    }

    /// Writes the line (target `access`, level INFO).
    pub fn emit(&self, shard: &Shard, head: &RequestHead) {
        if !self.on {
            return;
        }
        let now = shard.exact_mono_ns();
        let ms = |ns: u64| ns as f64 / 1e6;
        let opt = |c: &RefCell<Option<String>>| c.borrow().clone().unwrap_or_else(|| "-".into());
        let ttfb = self.first_byte_ns.get().map_or_else(
            || "-".to_owned(),
            |t| format!("{:.3}", ms(t - self.start_ns.min(t))),
        );
        tracing::info!(
            target: "access",
            request_id = %self.id,
            key = %opt(&self.key),
            method = head.method_str(),
            route = head.path(),
            model = %opt(&self.model),
            combo = %opt(&self.combo),
            provider = %opt(&self.provider),
            connection = %opt(&self.connection),
            attempts = self.attempts.get(),
            status = self.status.get(),
            bytes = self.bytes.get(),
            latency_ms = %format!("{:.3}", ms(now.saturating_sub(self.start_ns))),
            ttfb_ms = %ttfb,
            error = self.error.get().unwrap_or("-"),
            "access"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_read_as_format_writes_them() {
        for (a, b) in [
            (0u64, 0u64),
            (1, 0x100),
            (0xf, 0x10),
            (1_800_000_000_000, 0x1234_5601),
            (u64::MAX, u64::MAX >> 4),
            (1 << 63, 1 << 4),
        ] {
            assert_eq!(made_id(a, b).as_str(), format!("tg-{a:x}-{b:x}"));
            assert_eq!(
                made_id(a, b).as_bytes(),
                format!("tg-{a:x}-{b:x}").as_bytes()
            );
        }
    }

    #[test]
    fn hex_of_every_width_and_digit() {
        for shift in 0..64 {
            for n in [
                1u64 << shift,
                (1u64 << shift) - 1,
                u64::MAX >> shift,
                0xa5a5_5a5a_0f0f_f0f0 >> shift,
            ] {
                let mut buf = [b'x'; 32];
                let end = put_hex(&mut buf, 5, n);
                assert_eq!(&buf[5..end], format!("{n:x}").as_bytes());
                assert_eq!(&buf[..5], b"xxxxx");
            }
        }
        assert_eq!(hex8(0x0123_abcf), *b"0123abcf");
    }

    proptest::proptest! {
        /// Any pair of numbers is written as `format!` writes it.
        #[test]
        fn made_ids_match_format(a: u64, b: u64) {
            let id = made_id(a, b);
            proptest::prop_assert_eq!(id.as_str(), format!("tg-{a:x}-{b:x}"));
        }

        /// A client's id is kept exactly when the old filter chain kept it (non-empty, at
        /// most 128 printable ASCII bytes), and kept byte for byte.
        #[test]
        fn given_ids_are_kept_as_before(
            v in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => 0x21u8..0x7f,
                    1 => proptest::prelude::Just(b' '),
                    1 => proptest::prelude::Just(0x7fu8),
                    1 => 0x80u8..=0xff,
                    1 => 0u8..0x20,
                ],
                0..140,
            )
        ) {
            let before = Some(v.as_slice())
                .filter(|v| !v.is_empty() && v.len() <= MAX_REQUEST_ID)
                .filter(|v| v.iter().all(|b| b.is_ascii_graphic()))
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| heapless::String::<MAX_REQUEST_ID>::try_from(v).ok());
            let now = RequestId::given(&v);
            proptest::prop_assert_eq!(
                now.as_ref().map(RequestId::as_str),
                before.as_ref().map(|s| s.as_str())
            );
            if let Some(id) = now {
                proptest::prop_assert_eq!(id.as_bytes(), v.as_slice());
            }
        }
    }
}
