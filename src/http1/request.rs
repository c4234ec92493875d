//! Request heads from downstream clients: the request line, fields and the request's framing
//! (RFC 9112 §6.3 rules 4–7; a request is never close-delimited).

use bytes::{Buf, Bytes, BytesMut};

use super::head::{self, Facts, Fields, Span, StartLine};
use super::{BodyKind, Decoded, HeadError, MAX_HEAD_BYTES, Method, Persist};

/// A parsed request head. `raw` holds exactly the head bytes (request line through the final
/// CRLF CRLF, leading empty lines excluded); everything else is offsets into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    raw: Bytes,
    method: Method,
    method_span: Span,
    target: Span,
    /// The path's length within the target (up to the first `?`), found once at parse:
    /// the path is read several times per request.
    path_len: u32,
    /// The target when it is at most [`SHORT_TARGET`] bytes (every API path), copied at
    /// parse, where it was checked to be UTF-8: read without checking it again. Empty for
    /// a longer target (a target is never empty), which is read from `raw`.
    short_target: heapless::String<SHORT_TARGET>,
    minor_version: u8,
    fields: Fields,
    body_kind: BodyKind,
    keep_alive: bool,
    expect_continue: bool,
}

/// The longest request target kept as a string of its own (see `RequestHead::short_target`).
const SHORT_TARGET: usize = 64;

impl RequestHead {
    /// Gives the head bytes an allocation of their own: decoded, they share the
    /// connection's read buffer, and would keep all of it for as long as the request runs.
    pub fn detach(&mut self) {
        self.raw = Bytes::copy_from_slice(&self.raw);
    }

    pub fn method(&self) -> Method {
        self.method
    }

    /// The method token as sent (useful when [`method`](Self::method) is `Other`).
    pub fn method_str(&self) -> &str {
        match self.method {
            Method::Other => self.method_span.get_str(&self.raw),
            known => known.as_str(),
        }
    }

    /// The request-target as sent (origin-form `/path?query`, or absolute-form, or `*`).
    pub fn target(&self) -> &str {
        if self.short_target.is_empty() {
            self.target.get_str(&self.raw)
        } else {
            &self.short_target
        }
    }

    /// The target up to (excluding) the first `?`.
    pub fn path(&self) -> &str {
        let target = self.target();
        target.get(..self.path_len as usize).unwrap_or(target)
    }

    /// What follows the first `?` of the target, if there is one.
    pub fn query(&self) -> Option<&str> {
        self.target()
            .get(self.path_len as usize..)?
            .strip_prefix('?')
    }

    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    pub fn minor_version(&self) -> u8 {
        self.minor_version
    }

    /// The first value of the field `name` (ASCII case-insensitive), trimmed of surrounding
    /// whitespace.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields.get(&self.raw, name)
    }

    /// All fields in order, names as sent.
    #[cfg(any(test, fuzzing))]
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.fields.iter(&self.raw)
    }

    /// All fields in order, names as sent, as bytes (names are tokens, so ASCII).
    pub fn header_fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields.iter_bytes(&self.raw)
    }

    /// Number of header fields.
    #[cfg(test)]
    pub fn header_count(&self) -> usize {
        self.fields.len()
    }

    /// Length of the head in bytes (request line through the final CRLF CRLF).
    pub fn head_len(&self) -> usize {
        self.raw.len()
    }

    /// `Empty`, `Length(n)` or `Chunked`; never `CloseDelimited`.
    pub fn body_kind(&self) -> BodyKind {
        self.body_kind
    }

    /// HTTP/1.1: unless `Connection: close`; HTTP/1.0: only with `Connection: keep-alive`.
    pub fn keep_alive(&self) -> bool {
        self.keep_alive
    }

    /// [`keep_alive`](Self::keep_alive) as the response says it: an HTTP/1.0 request kept
    /// open hears so ([`Persist::Echo`]), an HTTP/1.1 one by default.
    pub fn persist(&self) -> Persist {
        match (self.keep_alive, self.minor_version) {
            (false, _) => Persist::Close,
            (true, 0) => Persist::Echo,
            (true, _) => Persist::KeepAlive,
        }
    }

    /// `Expect: 100-continue` on an HTTP/1.1 request (RFC 9110 §10.1.1: ignored for 1.0).
    pub fn expect_continue(&self) -> bool {
        self.expect_continue
    }

    #[cfg(any(test, fuzzing))]
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }
}

/// Decodes one request head from the front of `buf`.
///
/// On `Complete` the head bytes (and any leading empty lines) are split off the front of `buf`
/// without copying, leaving the body and any pipelined bytes in `buf`. On `Partial` `buf` is
/// untouched. No complete head within [`MAX_HEAD_BYTES`] is `Err(TooLarge)`.
pub fn decode_request_head(buf: &mut BytesMut) -> Result<Decoded<RequestHead>, HeadError> {
    if let Some(whole) = parse_whole(buf) {
        let (skip, len, parsed) = whole?;
        buf.advance(skip);
        let raw = buf.split_to(len).freeze();
        return Ok(Decoded::Complete(parsed.with_raw(raw)));
    }
    decode_located(buf)
}

/// The slow path: find the head's end with [`head::locate`] (which checks every line end
/// and the first byte as the bytes arrive), then parse exactly the head.
fn decode_located(buf: &mut BytesMut) -> Result<Decoded<RequestHead>, HeadError> {
    let Some(at) = head::locate(buf, MAX_HEAD_BYTES, StartLine::Request)? else {
        return Ok(Decoded::Partial);
    };
    let end = at.skip + at.len;
    let parsed = match buf.get(at.skip..end) {
        Some(bytes) => parse(bytes)?,
        None => return Err(HeadError::Malformed("head outside buffer")),
    };
    buf.advance(at.skip);
    let raw = buf.split_to(at.len).freeze();
    Ok(Decoded::Complete(parsed.with_raw(raw)))
}

/// Everything but the bytes, so the borrow of the buffer ends before it is split.
struct Parsed {
    method: Method,
    method_span: Span,
    target: Span,
    path_len: u32,
    short_target: heapless::String<SHORT_TARGET>,
    minor_version: u8,
    fields: Fields,
    body_kind: BodyKind,
    keep_alive: bool,
    expect_continue: bool,
}

impl Parsed {
    fn with_raw(self, raw: Bytes) -> RequestHead {
        RequestHead {
            raw,
            method: self.method,
            method_span: self.method_span,
            target: self.target,
            path_len: self.path_len,
            short_target: self.short_target,
            minor_version: self.minor_version,
            fields: self.fields,
            body_kind: self.body_kind,
            keep_alive: self.keep_alive,
            expect_continue: self.expect_continue,
        }
    }
}

/// The fast path, for a head that is whole in `buf` (as one read almost always brings it):
/// `httparse` over the buffer first, no [`head::locate`] scan. `Some` when `httparse` found
/// a whole head in which every line ends in CRLF: its leading empty lines, its length and
/// what [`parse`] would answer for those bytes (the slow path would find the same end and
/// parse the same bytes). `None` when the head is not whole, `httparse` refuses it, or a
/// line ends in a bare LF: the slow path then decides, so errors and their order stay
/// those of `locate` then `parse` however the bytes arrive.
fn parse_whole(buf: &[u8]) -> Option<Result<(usize, usize, Parsed), HeadError>> {
    let window = buf.get(..buf.len().min(MAX_HEAD_BYTES)).unwrap_or(buf);
    let mut skip = 0;
    while window.get(skip..skip + 2) == Some(b"\r\n".as_slice()) {
        skip += 2;
    }
    let rest = window.get(skip..)?;
    if !head::is_tchar(*rest.first()?) {
        return None;
    }
    let mut storage = head::header_storage();
    let mut req = httparse::Request::new(&mut []);
    let Ok(httparse::Status::Complete(n)) = req.parse_with_uninit_headers(rest, &mut storage)
    else {
        return None;
    };
    let bytes = rest.get(..n)?;
    if !head::lines_end_in_crlf(bytes, req.headers) {
        return None;
    }
    Some(finish(bytes, &req).map(|parsed| (skip, n, parsed)))
}

/// Parses `bytes`, which is exactly one head ending in CRLF CRLF.
fn parse(bytes: &[u8]) -> Result<Parsed, HeadError> {
    let mut storage = head::header_storage();
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(bytes, &mut storage) {
        Ok(httparse::Status::Complete(n)) if n == bytes.len() => {}
        Ok(_) => return Err(HeadError::Malformed("head does not end at the empty line")),
        Err(e) => return Err(head::map_httparse(e, bytes, StartLine::Request)),
    }
    finish(bytes, &req)
}

/// The head `httparse` parsed from exactly `bytes`, checked and recorded.
fn finish(bytes: &[u8], req: &httparse::Request<'_, '_>) -> Result<Parsed, HeadError> {
    let (Some(method), Some(target), Some(minor_version)) = (req.method, req.path, req.version)
    else {
        return Err(HeadError::Malformed("incomplete request line"));
    };
    if minor_version > 1 {
        return Err(HeadError::UnsupportedVersion);
    }
    let (fields, facts) = head::collect(bytes, req.headers)?;
    if facts.hosts > 1 {
        return Err(HeadError::Malformed("more than one Host field"));
    }
    Ok(Parsed {
        method: Method::from_bytes(method.as_bytes()),
        method_span: head::span(bytes, method.as_bytes())?,
        target: head::span(bytes, target.as_bytes())?,
        // The target is at most a head long (16 KiB), so its offsets fit.
        path_len: u32::try_from(memchr::memchr(b'?', target.as_bytes()).unwrap_or(target.len()))
            .map_err(|_| HeadError::TooLarge)?,
        // Longer than SHORT_TARGET: left empty, read from the head's bytes.
        short_target: heapless::String::try_from(target).unwrap_or_default(),
        minor_version,
        fields,
        body_kind: body_kind(&facts, minor_version)?,
        keep_alive: facts.persistent(minor_version),
        expect_continue: facts.expect_continue && minor_version >= 1,
    })
}

/// RFC 9112 §6.1 and §6.3: TE with CL is refused outright, as is TE in HTTP/1.0.
fn body_kind(facts: &Facts, minor_version: u8) -> Result<BodyKind, HeadError> {
    let has_length = facts.content_length != head::ContentLength::Absent;
    if facts.has_transfer_encoding() {
        if has_length {
            return Err(HeadError::ConflictingFraming);
        }
        if minor_version == 0 || !facts.is_chunked() {
            return Err(HeadError::UnsupportedTransferEncoding);
        }
        return Ok(BodyKind::Chunked);
    }
    match facts.content_length {
        head::ContentLength::Absent => Ok(BodyKind::Empty),
        head::ContentLength::Value(n) => Ok(BodyKind::Length(n)),
        head::ContentLength::Bad => Err(HeadError::BadContentLength),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast path answers as the slow path does (head, error, and what is left in the
    /// buffer) for heads with every byte in turn replaced by each byte that matters to line
    /// ends, tokens and values, and cut at every length.
    #[test]
    fn whole_head_fast_path_agrees_with_the_slow_path() {
        let heads: [&[u8]; 3] = [
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: h:1\r\nX-E:\r\nX-T: a \t\r\nContent-Length: 2\r\n\r\n{}GET",
            b"\r\nGET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            b"GET * HTTP/1.1\r\n\r\n",
        ];
        let swaps = [b'\n', b'\r', b' ', b'\t', b':', 0, b'a', 0x80];
        let check = |bytes: &[u8]| {
            let mut fast = BytesMut::from(bytes);
            let mut slow = BytesMut::from(bytes);
            let got = decode_request_head(&mut fast);
            let want = decode_located(&mut slow);
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(bytes));
            assert_eq!(fast, slow, "{:?}", String::from_utf8_lossy(bytes));
        };
        crate::http1::tests::each_variant(&heads, &swaps, check);
    }
}
