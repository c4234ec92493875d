//! Response heads from upstream providers: the status line, fields and the response's framing
//! (RFC 9112 §6.3), with interim 1xx heads skipped.

use bytes::{Buf, Bytes, BytesMut};

use super::head::{self, ContentLength, Facts, Fields, Span, StartLine};
use super::{BodyKind, Decoded, HeadError, MAX_RESPONSE_HEAD_BYTES, Method};

/// A parsed response head. `raw` holds exactly the head bytes; everything else is offsets
/// into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    raw: Bytes,
    status: u16,
    reason: Span,
    minor_version: u8,
    fields: Fields,
    body_kind: BodyKind,
    keep_alive: bool,
}

impl ResponseHead {
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The reason phrase as sent (empty when absent, or when it holds non-ASCII bytes).
    #[cfg(any(test, fuzzing))]
    pub fn reason(&self) -> &str {
        self.reason.get_str(&self.raw)
    }

    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    #[cfg(test)]
    pub fn minor_version(&self) -> u8 {
        self.minor_version
    }

    /// Gives the head bytes an allocation of their own. Decoded, they share the read
    /// buffer they were split from, which then cannot be reused in place: the next read
    /// into it would allocate a second buffer, and a long answer would hold both.
    pub fn detach(&mut self) {
        self.raw = Bytes::copy_from_slice(&self.raw);
    }

    /// The first value of the field `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields.get(&self.raw, name)
    }

    /// All fields in order, names as sent.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.fields.iter(&self.raw)
    }

    /// All fields in order, names as bytes as sent (tokens, so no UTF-8 check is made:
    /// what a relay that writes them on needs).
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields.iter_bytes(&self.raw)
    }

    /// Number of header fields.
    #[cfg(test)]
    pub fn header_count(&self) -> usize {
        self.fields.len()
    }

    /// `Empty` for a HEAD request and for 1xx, 204 and 304; `Chunked` for
    /// `Transfer-Encoding: chunked`; `Length(n)` for `Content-Length`; else `CloseDelimited`.
    pub fn body_kind(&self) -> BodyKind {
        self.body_kind
    }

    /// Whether the connection may carry another request after this response: false for a
    /// close-delimited body, `Connection: close`, or HTTP/1.0 without `Connection: keep-alive`.
    pub fn keep_alive(&self) -> bool {
        self.keep_alive
    }

    /// Bytes of the head as sent (status line, fields, blank line).
    pub fn wire_len(&self) -> usize {
        self.raw.len()
    }

    #[cfg(any(test, fuzzing))]
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }
}

/// Decodes the final response head from the front of `buf`.
///
/// Interim heads (100..=199 except 101) are split off and dropped as they complete, so on
/// `Partial` `buf` may have lost interim heads but nothing else. Each head is bounded by
/// [`MAX_RESPONSE_HEAD_BYTES`]. `request_method` decides whether a body can follow (HEAD).
pub fn decode_response_head(
    buf: &mut BytesMut,
    request_method: Method,
) -> Result<Decoded<ResponseHead>, HeadError> {
    loop {
        let found = match parse_whole(buf, request_method) {
            Some(whole) => whole?,
            None => match locate_and_parse(buf, request_method)? {
                Some(found) => found,
                None => return Ok(Decoded::Partial),
            },
        };
        let (skip, len, parsed) = found;
        buf.advance(skip);
        let raw = buf.split_to(len).freeze();
        if !is_interim(parsed.status) {
            return Ok(Decoded::Complete(parsed.with_raw(raw)));
        }
    }
}

/// The slow path: find the head's end with [`head::locate`] (which checks every line end
/// and the start as the bytes arrive), then parse exactly the head. `None`: not whole yet.
fn locate_and_parse(
    buf: &[u8],
    request_method: Method,
) -> Result<Option<(usize, usize, Parsed)>, HeadError> {
    let Some(at) = head::locate(buf, MAX_RESPONSE_HEAD_BYTES, StartLine::Response)? else {
        return Ok(None);
    };
    match buf.get(at.skip..at.skip + at.len) {
        Some(bytes) => Ok(Some((at.skip, at.len, parse(bytes, request_method)?))),
        None => Err(HeadError::Malformed("head outside buffer")),
    }
}

fn is_interim(status: u16) -> bool {
    (100..=199).contains(&status) && status != 101
}

struct Parsed {
    status: u16,
    reason: Span,
    minor_version: u8,
    fields: Fields,
    body_kind: BodyKind,
    keep_alive: bool,
}

impl Parsed {
    fn with_raw(self, raw: Bytes) -> ResponseHead {
        ResponseHead {
            raw,
            status: self.status,
            reason: self.reason,
            minor_version: self.minor_version,
            fields: self.fields,
            body_kind: self.body_kind,
            keep_alive: self.keep_alive,
        }
    }
}

/// The fast path for a head whole in `buf`, as `request::parse_whole` (the same contract:
/// `None` leaves the decision to `locate` then `parse`).
fn parse_whole(
    buf: &[u8],
    request_method: Method,
) -> Option<Result<(usize, usize, Parsed), HeadError>> {
    let window = buf
        .get(..buf.len().min(MAX_RESPONSE_HEAD_BYTES))
        .unwrap_or(buf);
    let mut skip = 0;
    while window.get(skip..skip + 2) == Some(b"\r\n".as_slice()) {
        skip += 2;
    }
    let rest = window.get(skip..)?;
    if !rest.starts_with(b"HTTP/") {
        return None;
    }
    let mut storage = head::header_storage();
    let mut res = httparse::Response::new(&mut []);
    let Ok(httparse::Status::Complete(n)) = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, rest, &mut storage)
    else {
        return None;
    };
    let bytes = rest.get(..n)?;
    if !head::lines_end_in_crlf(bytes, res.headers) {
        return None;
    }
    Some(finish(bytes, &res, request_method).map(|parsed| (skip, n, parsed)))
}

fn parse(bytes: &[u8], request_method: Method) -> Result<Parsed, HeadError> {
    let mut storage = head::header_storage();
    let mut res = httparse::Response::new(&mut []);
    match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut res,
        bytes,
        &mut storage,
    ) {
        Ok(httparse::Status::Complete(n)) if n == bytes.len() => {}
        Ok(_) => return Err(HeadError::Malformed("head does not end at the empty line")),
        Err(e) => return Err(head::map_httparse(e, bytes, StartLine::Response)),
    }
    finish(bytes, &res, request_method)
}

/// The head `httparse` parsed from exactly `bytes`, checked and recorded.
fn finish(
    bytes: &[u8],
    res: &httparse::Response<'_, '_>,
    request_method: Method,
) -> Result<Parsed, HeadError> {
    let (Some(status), Some(minor_version)) = (res.code, res.version) else {
        return Err(HeadError::Malformed("incomplete status line"));
    };
    if minor_version > 1 {
        return Err(HeadError::UnsupportedVersion);
    }
    if status < 100 {
        return Err(HeadError::Malformed("invalid status line"));
    }
    let reason = res.reason.unwrap_or_default();
    let (fields, facts) = head::collect(bytes, res.headers)?;
    let body_kind = body_kind(&facts, status, minor_version, request_method)?;
    Ok(Parsed {
        status,
        reason: head::Span::of(bytes, reason.as_bytes()).unwrap_or_default(),
        minor_version,
        fields,
        body_kind,
        keep_alive: body_kind != BodyKind::CloseDelimited && facts.persistent(minor_version),
    })
}

/// RFC 9112 §6.3 in order; framing fields of bodiless responses are not looked at.
fn body_kind(
    facts: &Facts,
    status: u16,
    minor_version: u8,
    request_method: Method,
) -> Result<BodyKind, HeadError> {
    if request_method == Method::Head || status < 200 || status == 204 || status == 304 {
        return Ok(BodyKind::Empty);
    }
    if facts.has_transfer_encoding() {
        if facts.content_length != ContentLength::Absent {
            return Err(HeadError::ConflictingFraming);
        }
        if minor_version == 0 || !facts.is_chunked() {
            return Err(HeadError::UnsupportedTransferEncoding);
        }
        return Ok(BodyKind::Chunked);
    }
    match facts.content_length {
        ContentLength::Absent => Ok(BodyKind::CloseDelimited),
        ContentLength::Value(n) => Ok(BodyKind::Length(n)),
        ContentLength::Bad => Err(HeadError::BadContentLength),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast path answers as the slow path does for heads with every byte in turn
    /// replaced by (and preceded by) each byte that matters to line ends and values, and
    /// cut at every length.
    #[test]
    fn whole_head_fast_path_agrees_with_the_slow_path() {
        let heads: [&[u8]; 2] = [
            b"HTTP/1.1 200 OK\r\nContent-Type: a/b\r\nX-E:\r\nX-T: a \t\r\nContent-Length: 2\r\n\r\n{}",
            b"\r\nHTTP/1.0 204\r\nConnection: keep-alive\r\n\r\n",
        ];
        let swaps = [b'\n', b'\r', b' ', b'\t', b':', 0, b'a', 0x80];
        let check = |bytes: &[u8]| {
            for method in [Method::Get, Method::Head] {
                let fast = parse_whole(bytes, method);
                let slow = locate_and_parse(bytes, method);
                let text = String::from_utf8_lossy(bytes);
                match (fast, slow) {
                    (None, _) => {}
                    (Some(Ok(f)), Ok(Some(s))) => {
                        assert_eq!((f.0, f.1), (s.0, s.1), "{text:?}");
                        let raw = Bytes::copy_from_slice(&bytes[f.0..f.0 + f.1]);
                        assert_eq!(f.2.with_raw(raw.clone()), s.2.with_raw(raw), "{text:?}");
                    }
                    (Some(Err(f)), Err(s)) => assert_eq!(f, s, "{text:?}"),
                    (Some(f), s) => panic!("{text:?}: fast {:?}, slow {:?}", f.err(), s.err()),
                }
            }
        };
        crate::http1::tests::each_variant(&heads, &swaps, check);
    }
}
