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
        let Some(at) = head::locate(buf, MAX_RESPONSE_HEAD_BYTES, StartLine::Response)? else {
            return Ok(Decoded::Partial);
        };
        let end = at.skip + at.len;
        let parsed = match buf.get(at.skip..end) {
            Some(bytes) => parse(bytes, request_method)?,
            None => return Err(HeadError::Malformed("head outside buffer")),
        };
        buf.advance(at.skip);
        let raw = buf.split_to(at.len).freeze();
        if !is_interim(parsed.status) {
            return Ok(Decoded::Complete(parsed.with_raw(raw)));
        }
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
