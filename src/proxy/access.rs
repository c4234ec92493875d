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

/// A request id: the client's (at most [`MAX_REQUEST_ID`] bytes) or one made here, kept
/// in place (no allocation per request).
pub type RequestId = heapless::String<MAX_REQUEST_ID>;

/// `tg-<wall ms>-<sequence>`, both in lower-case hex: the id of a request that brought
/// none. Written digit by digit into a stack buffer: `format!` here was ~2 % of a proxied
/// request's instructions (callgrind, session 7), and pushing `char`s ~0.5 %.
fn made_id(wall_ms: u64, seq: u64) -> RequestId {
    let mut buf = [0u8; 3 + 16 + 1 + 16];
    buf[..3].copy_from_slice(b"tg-");
    let mut n = put_hex(&mut buf, 3, wall_ms);
    buf[n] = b'-';
    n = put_hex(&mut buf, n + 1, seq);
    // Only ASCII was written, and 36 bytes fit in the id.
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| RequestId::try_from(s).ok())
        .unwrap_or_default()
}

/// Writes `n` in lower-case hex without leading zeros (`0` for zero), as `{:x}` writes it,
/// at `buf[at..]`; returns where it ended. `buf` has room for 16 digits from `at`.
fn put_hex(buf: &mut [u8], at: usize, n: u64) -> usize {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digits = (64 - n.leading_zeros()).div_ceil(4).max(1) as usize;
    for (i, slot) in buf.iter_mut().skip(at).take(digits).enumerate() {
        *slot = DIGITS[((n >> ((digits - 1 - i) * 4)) & 0xf) as usize];
    }
    at + digits
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
        let given = head
            .header(REQUEST_ID_HEADER)
            .filter(|v| !v.is_empty() && v.len() <= MAX_REQUEST_ID)
            .filter(|v| v.iter().all(|b| b.is_ascii_graphic()))
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| RequestId::try_from(v).ok());
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
        }
    }
}
