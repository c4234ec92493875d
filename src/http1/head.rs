//! What request and response heads share: finding where a head ends within its byte limit,
//! mapping `httparse` errors, storing fields as 16-bit spans into the head bytes, and reading
//! the framing fields (`Content-Length`, `Transfer-Encoding`, `Connection`, `Expect`, `Host`)
//! in one pass.

use std::mem::MaybeUninit;

use memchr::memchr_iter;

use super::{HeadError, MAX_HEAD_BYTES, MAX_HEADERS, MAX_RESPONSE_HEAD_BYTES};

/// Uninitialised stack storage for `httparse` (nothing is zeroed on the hot path).
pub(crate) type HeaderStorage<'b> = [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS];

pub(crate) fn header_storage<'b>() -> HeaderStorage<'b> {
    [const { MaybeUninit::uninit() }; MAX_HEADERS]
}

/// Which start line a head must begin with (checked before the head is complete).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartLine {
    Request,
    Response,
}

/// A complete head inside a buffer: `skip` bytes of leading empty lines, then `len` bytes of
/// head ending in CRLF CRLF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Located {
    pub(crate) skip: usize,
    pub(crate) len: usize,
}

/// Finds the first complete head in `buf`, which must end within `max` bytes (leading empty
/// lines included). `Ok(None)` means "need more bytes". This is a `memchr` scan, not a parse:
/// a head arriving in many reads is parsed once, when complete. The scan also checks what it
/// can cheaply (the first byte, that every LF follows a CR), in the same order whether the head
/// is complete or not, so an error never depends on how the bytes were split.
pub(crate) fn locate(
    buf: &[u8],
    max: usize,
    start: StartLine,
) -> Result<Option<Located>, HeadError> {
    let window = buf.get(..buf.len().min(max)).unwrap_or(buf);
    let mut skip = 0;
    while window.get(skip..skip + 2) == Some(b"\r\n".as_slice()) {
        skip += 2;
    }
    let rest = window.get(skip..).unwrap_or_default();
    let need_more = || {
        if buf.len() >= max {
            Err(HeadError::TooLarge)
        } else {
            Ok(None)
        }
    };
    if rest == b"\r" {
        // Maybe the start of one more empty line.
        return need_more();
    }
    check_start(rest, start)?;
    // One pass over the line feeds: each must follow a CR, and the first empty line ends the
    // head. `rest` never starts with CRLF, so "\r\n\r\n" here is a real end of head.
    for at in memchr_iter(b'\n', rest) {
        let before = at.checked_sub(1).and_then(|i| rest.get(i));
        if before != Some(&b'\r') {
            return Err(HeadError::Malformed("bare LF"));
        }
        if at >= 3 && rest.get(at - 3..at - 1) == Some(b"\r\n".as_slice()) {
            return Ok(Some(Located { skip, len: at + 1 }));
        }
    }
    need_more()
}

fn check_start(rest: &[u8], start: StartLine) -> Result<(), HeadError> {
    match start {
        StartLine::Request => match rest.first() {
            Some(&b) if !is_tchar(b) => Err(HeadError::Malformed("invalid request line")),
            _ => Ok(()),
        },
        StartLine::Response => {
            const PREFIX: &[u8] = b"HTTP/";
            let n = rest.len().min(PREFIX.len());
            if rest.get(..n) == PREFIX.get(..n) {
                Ok(())
            } else {
                Err(HeadError::Malformed("invalid status line"))
            }
        }
    }
}

/// Maps an `httparse` error on the complete head `head`. `httparse` reports any trouble in
/// the start line's version slot as `Version`; only a well-formed `HTTP/d.d` other than 1.0
/// and 1.1 is reported as [`HeadError::UnsupportedVersion`], anything else is malformed.
pub(crate) fn map_httparse(err: httparse::Error, head: &[u8], start: StartLine) -> HeadError {
    match err {
        httparse::Error::HeaderName => HeadError::Malformed("invalid header name"),
        httparse::Error::HeaderValue => HeadError::Malformed("invalid header value"),
        httparse::Error::NewLine => HeadError::Malformed("invalid line ending"),
        httparse::Error::Status => HeadError::Malformed("invalid status line"),
        httparse::Error::Token => HeadError::Malformed("invalid request line"),
        httparse::Error::TooManyHeaders => HeadError::TooManyHeaders,
        httparse::Error::Version => {
            let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
            let version = match start {
                // method SP target SP version: exactly three parts.
                StartLine::Request => {
                    let mut parts = line.split(|&b| b == b' ');
                    match (parts.next(), parts.next(), parts.next(), parts.next()) {
                        (Some(_), Some(_), Some(v), None) => v,
                        _ => &[],
                    }
                }
                StartLine::Response => line.get(..8).unwrap_or_default(),
            };
            match version {
                [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
                    if major.is_ascii_digit()
                        && minor.is_ascii_digit()
                        && !(*major == b'1' && matches!(minor, b'0' | b'1')) =>
                {
                    HeadError::UnsupportedVersion
                }
                _ => match start {
                    StartLine::Request => HeadError::Malformed("invalid request line"),
                    StartLine::Response => HeadError::Malformed("invalid status line"),
                },
            }
        }
    }
}

/// RFC 9110 `tchar`.
///
/// One table load per byte: field names are checked byte by byte on every head written.
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

static TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < table.len() {
        table[i] = matches!(i as u8,
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9'
            | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+'
            | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~');
        i += 1;
    }
    table
};

/// RFC 9110 field-value byte (HTAB, SP, VCHAR, obs-text); the same set `httparse` accepts.
pub(crate) fn is_field_value_byte(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

/// A byte range of the head, as offsets (heads are far below 4 GiB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    start: u32,
    len: u32,
}

impl Span {
    /// Where `part` lies inside `base`; `None` if it does not lie there.
    pub(crate) fn of(base: &[u8], part: &[u8]) -> Option<Span> {
        if part.is_empty() {
            return Some(Span::default());
        }
        let start = (part.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
        if start.checked_add(part.len())? > base.len() {
            return None;
        }
        Some(Span {
            start: u32::try_from(start).ok()?,
            len: u32::try_from(part.len()).ok()?,
        })
    }

    pub(crate) fn get<'a>(&self, raw: &'a [u8]) -> &'a [u8] {
        let start = self.start as usize;
        raw.get(start..start.saturating_add(self.len as usize))
            .unwrap_or_default()
    }

    pub(crate) fn get_str<'a>(&self, raw: &'a [u8]) -> &'a str {
        std::str::from_utf8(self.get(raw)).unwrap_or_default()
    }
}

pub(crate) fn span(base: &[u8], part: &[u8]) -> Result<Span, HeadError> {
    Span::of(base, part).ok_or(HeadError::Malformed("field outside head"))
}

/// A field's name and value as 16-bit spans into its head: every head is at most
/// [`MAX_RESPONSE_HEAD_BYTES`] (64 KiB) long, so every offset and length inside one fits,
/// and a field takes 8 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct FieldSpan {
    name_at: u16,
    name_len: u16,
    value_at: u16,
    value_len: u16,
}

const _: () = assert!(MAX_HEAD_BYTES <= 1 << 16 && MAX_RESPONSE_HEAD_BYTES <= 1 << 16);

impl FieldSpan {
    /// Where `name` and `value` lie inside `base` (as [`Span::of`]: an empty part is the
    /// empty span at 0); `None` if either does not lie there.
    fn of(base: &[u8], name: &[u8], value: &[u8]) -> Option<FieldSpan> {
        let (name_at, name_len) = short_span(base, name)?;
        let (value_at, value_len) = short_span(base, value)?;
        Some(FieldSpan {
            name_at,
            name_len,
            value_at,
            value_len,
        })
    }

    fn name<'a>(&self, raw: &'a [u8]) -> &'a [u8] {
        short_get(raw, self.name_at, self.name_len)
    }

    fn value<'a>(&self, raw: &'a [u8]) -> &'a [u8] {
        short_get(raw, self.value_at, self.value_len)
    }
}

/// [`Span::of`] with 16-bit offsets: one range check (the part starts within `base` and
/// ends within it), then the two conversions.
fn short_span(base: &[u8], part: &[u8]) -> Option<(u16, u16)> {
    if part.is_empty() {
        return Some((0, 0));
    }
    // Below `base` wraps to an offset past its end, refused like one.
    let start = (part.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
    if start > base.len() || part.len() > base.len() - start {
        return None;
    }
    Some((u16::try_from(start).ok()?, u16::try_from(part.len()).ok()?))
}

fn short_get(raw: &[u8], at: u16, len: u16) -> &[u8] {
    let start = usize::from(at);
    raw.get(start..start + usize::from(len)).unwrap_or_default()
}

/// The header fields of one head, in order, as spans into its bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fields {
    spans: Vec<FieldSpan>,
    lengths: NameLengths,
}

/// The lengths of a head's field names as a bit set (bit `min(len, 63)`): most lookups are
/// for a field the head does not have (`x-request-id`, session and lease fields,
/// `x-omniroute-connection`, …), and are answered by one bit test instead of a walk over
/// every field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct NameLengths(u64);

impl NameLengths {
    fn bit(len: usize) -> u64 {
        1 << len.min(63)
    }

    fn add(&mut self, len: usize) {
        self.0 |= Self::bit(len);
    }

    fn may_have(&self, len: usize) -> bool {
        self.0 & Self::bit(len) != 0
    }
}

impl Fields {
    fn with_capacity(n: usize) -> Fields {
        Fields {
            spans: Vec::with_capacity(n),
            lengths: NameLengths::default(),
        }
    }

    fn push(&mut self, span: FieldSpan) {
        self.lengths.add(usize::from(span.name_len));
        self.spans.push(span);
    }

    fn spans(&self) -> &[FieldSpan] {
        &self.spans
    }
}

/// `a.eq_ignore_ascii_case(b)` without an early exit, so the loop vectorises: field names
/// are short, and compared on every field of every head.
pub(crate) fn same_name(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).fold(0u8, |diff, (x, y)| {
            diff | (x.to_ascii_lowercase() ^ y.to_ascii_lowercase())
        }) == 0
}

impl Fields {
    /// First value of `name` (ASCII case-insensitive).
    pub(crate) fn get<'a>(&self, raw: &'a [u8], name: &str) -> Option<&'a [u8]> {
        let name = name.as_bytes();
        if !self.lengths.may_have(name.len()) {
            return None;
        }
        self.spans()
            .iter()
            .find(|f| usize::from(f.name_len) == name.len() && same_name(f.name(raw), name))
            .map(|f| f.value(raw))
    }

    pub(crate) fn iter<'a>(
        &'a self,
        raw: &'a [u8],
    ) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        self.spans().iter().map(move |f| {
            (
                std::str::from_utf8(f.name(raw)).unwrap_or_default(),
                f.value(raw),
            )
        })
    }

    /// As [`iter`](Self::iter), names as bytes (they are tokens: no UTF-8 check needed).
    pub(crate) fn iter_bytes<'a>(
        &'a self,
        raw: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        self.spans()
            .iter()
            .map(move |f| (f.name(raw), f.value(raw)))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.spans().len()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ContentLength {
    #[default]
    Absent,
    Value(u64),
    Bad,
}

/// What the framing-relevant fields say, gathered in the same pass that records spans.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    pub(crate) content_length: ContentLength,
    te_fields: u32,
    te_codings: u32,
    te_chunked: u32,
    pub(crate) close: bool,
    pub(crate) keep_alive: bool,
    pub(crate) expect_continue: bool,
    pub(crate) hosts: u32,
}

impl Facts {
    pub(crate) fn has_transfer_encoding(&self) -> bool {
        self.te_fields > 0
    }

    /// The transfer coding list is exactly `chunked`.
    pub(crate) fn is_chunked(&self) -> bool {
        self.te_codings == 1 && self.te_chunked == 1
    }

    /// Keep-alive per RFC 9112 §9.3 from the `Connection` tokens and the minor version.
    pub(crate) fn persistent(&self, minor_version: u8) -> bool {
        !self.close && (minor_version >= 1 || self.keep_alive)
    }
}

/// Records spans (relative to `base`, the head) and reads the framing fields.
pub(crate) fn collect(
    base: &[u8],
    headers: &[httparse::Header<'_>],
) -> Result<(Fields, Facts), HeadError> {
    let mut fields = Fields::with_capacity(headers.len());
    let mut facts = Facts::default();
    for h in headers {
        let name = h.name.as_bytes();
        fields.push(
            FieldSpan::of(base, name, h.value).ok_or(HeadError::Malformed("field outside head"))?,
        );
        note(&mut facts, name, h.value);
    }
    Ok((fields, facts))
}

/// Whether every line of `head`, a whole head as `httparse` parsed it into `headers`, ends
/// in CRLF: the start line, each field line and the final empty line. `httparse` accepts a
/// bare LF as a line ending; this is what lets a head parsed before [`locate`] ran skip it.
/// Only true answers are final: on false the caller takes the slow path, which names the
/// error. Every LF in a head `httparse` accepts ends one of those lines (no field value,
/// target or reason phrase holds one, and obsolete line folding is refused), so checking
/// each line's end checks them all.
pub(crate) fn lines_end_in_crlf(head: &[u8], headers: &[httparse::Header<'_>]) -> bool {
    let crlf_at = |at: usize| head.get(at..at + 2) == Some(b"\r\n".as_slice());
    // The start line: its first LF.
    let Some(lf) = memchr::memchr(b'\n', head) else {
        return false;
    };
    if lf == 0 || head.get(lf - 1) != Some(&b'\r') {
        return false;
    }
    // Each field line ends where its value ends, after any whitespace `httparse` trimmed
    // (an empty value points at its line's end).
    let base = head.as_ptr() as usize;
    for h in headers {
        let Some(mut at) = (h.value.as_ptr() as usize)
            .checked_sub(base)
            .map(|start| start + h.value.len())
        else {
            return false;
        };
        while matches!(head.get(at), Some(b' ' | b'\t')) {
            at += 1;
        }
        if !crlf_at(at) {
            return false;
        }
    }
    head.len() >= 2 && crlf_at(head.len() - 2)
}

fn note(facts: &mut Facts, name: &[u8], value: &[u8]) {
    match name.len() {
        4 if same_name(name, b"host") => facts.hosts += 1,
        6 if same_name(name, b"expect")
            && trim_ows(value).eq_ignore_ascii_case(b"100-continue") =>
        {
            facts.expect_continue = true;
        }
        10 if same_name(name, b"connection") => {
            for token in list_elements(value) {
                if token.eq_ignore_ascii_case(b"close") {
                    facts.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    facts.keep_alive = true;
                }
            }
        }
        14 if same_name(name, b"content-length") => {
            // A value of digits alone (as every client sends it) is its own one-element
            // list: merged without the list split.
            facts.content_length = match parse_decimal(value) {
                Some(n) => merge_length(facts.content_length, Some(n)),
                None => merge_content_length(facts.content_length, value),
            };
        }
        17 if same_name(name, b"transfer-encoding") => {
            facts.te_fields += 1;
            for coding in list_elements(value) {
                facts.te_codings += 1;
                if coding.eq_ignore_ascii_case(b"chunked") {
                    facts.te_chunked += 1;
                }
            }
        }
        _ => {}
    }
}

fn merge_content_length(seen: ContentLength, value: &[u8]) -> ContentLength {
    let mut merged = seen;
    let mut any = false;
    for element in list_elements(value) {
        any = true;
        merged = merge_length(merged, parse_decimal(element));
    }
    if any { merged } else { ContentLength::Bad }
}

/// One `Content-Length` element (`None`: not a decimal) merged into what was seen.
fn merge_length(seen: ContentLength, element: Option<u64>) -> ContentLength {
    match (seen, element) {
        (ContentLength::Bad, _) | (_, None) => ContentLength::Bad,
        (ContentLength::Absent, Some(n)) => ContentLength::Value(n),
        (ContentLength::Value(m), Some(n)) if m == n => ContentLength::Value(m),
        (ContentLength::Value(_), Some(_)) => ContentLength::Bad,
    }
}

/// 1*DIGIT into a `u64`, `None` on anything else or overflow.
pub(crate) fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

/// Non-empty elements of a comma-separated list, trimmed of optional whitespace.
fn list_elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|e| !e.is_empty())
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_is_strict_and_checked() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"0042"), Some(42));
        assert_eq!(parse_decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_decimal(b"18446744073709551616"), None);
        for bad in [&b""[..], b"+1", b"-1", b"1.0", b"0x10", b" 1", b"1 "] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn list_elements_skip_empty_and_trim() {
        let got: Vec<&[u8]> = list_elements(b" ,a ,\tb\t,, c").collect();
        assert_eq!(got, [&b"a"[..], b"b", b"c"]);
        assert_eq!(trim_ows(b" \t "), b"");
    }

    #[test]
    fn same_name_is_eq_ignore_ascii_case() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(
                    same_name(&[a], &[b]),
                    [a].eq_ignore_ascii_case(&[b]),
                    "{a} {b}"
                );
            }
        }
        for (a, b) in [
            ("Content-Length", "content-length"),
            ("Content-Length", "content-lengtH"),
            ("Content-Length", "content_length"),
            ("host", "hosts"),
            ("", ""),
        ] {
            assert_eq!(
                same_name(a.as_bytes(), b.as_bytes()),
                a.eq_ignore_ascii_case(b),
                "{a} {b}"
            );
        }
    }

    /// The fields of a complete header block (up to 96 fields), as the request path keeps them.
    fn collected(head: &str) -> Fields {
        let mut storage = [httparse::EMPTY_HEADER; 96];
        let httparse::Status::Complete((_, parsed)) =
            httparse::parse_headers(head.as_bytes(), &mut storage).unwrap()
        else {
            panic!("partial")
        };
        collect(head.as_bytes(), parsed).unwrap().0
    }

    #[test]
    fn field_lookup_by_name_of_any_length() {
        let long = "x-".repeat(40);
        let head = format!("a: 1\r\nBcD: 2\r\n{long}: 3\r\n{long}y: 4\r\n\r\n");
        let fields = collected(&head);
        let raw = head.as_bytes();
        assert_eq!(fields.get(raw, "A"), Some(&b"1"[..]));
        assert_eq!(fields.get(raw, "bcd"), Some(&b"2"[..]));
        assert_eq!(fields.get(raw, &long), Some(&b"3"[..]));
        assert_eq!(fields.get(raw, &format!("{long}Y")), Some(&b"4"[..]));
        for absent in ["b", "ab", "bce", "x-request-id", &format!("{long}z")] {
            assert_eq!(fields.get(raw, absent), None, "{absent}");
        }
        assert_eq!(fields.clone(), fields);
    }

    /// However many fields a head has, they are kept in order and each is found by name.
    #[test]
    fn fields_keep_order_and_lookup() {
        for n in [0, 1, 15, 16, 17, 40, 96] {
            let head: String = (0..n)
                .map(|i| format!("X-F{i}: v {i}\r\n"))
                .collect::<String>()
                + "\r\n";
            let fields = collected(&head);
            let raw = head.as_bytes();
            assert_eq!(fields.len(), n);
            let got: Vec<(&[u8], &[u8])> = fields.iter_bytes(raw).collect();
            let written: Vec<(String, String)> = (0..n)
                .map(|i| (format!("X-F{i}"), format!("v {i}")))
                .collect();
            let want: Vec<(&[u8], &[u8])> = written
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
                .collect();
            assert_eq!(got, want);
            for i in 0..n {
                let value = format!("v {i}");
                assert_eq!(fields.get(raw, &format!("x-f{i}")), Some(value.as_bytes()));
            }
            assert_eq!(fields.get(raw, &format!("x-f{n}")), None);
            assert_eq!(fields.clone(), fields);
        }
    }

    /// A `Content-Length` of digits alone takes a shortcut past the list split: the same
    /// facts as the list reading, alone and after another `Content-Length`.
    #[test]
    fn content_length_shortcut_agrees_with_the_list_reading() {
        let values: [&[u8]; 12] = [
            b"0",
            b"42",
            b"0042",
            b"18446744073709551615",
            b"18446744073709551616",
            b"",
            b"4 2",
            b"42,42",
            b"42, 43",
            b"+1",
            b"1a",
            b" 42",
        ];
        for seen in [
            ContentLength::Absent,
            ContentLength::Value(42),
            ContentLength::Bad,
        ] {
            for v in values {
                let mut facts = Facts {
                    content_length: seen,
                    ..Facts::default()
                };
                note(&mut facts, b"Content-Length", v);
                assert_eq!(
                    facts.content_length,
                    merge_content_length(seen, v),
                    "{seen:?} {v:?}"
                );
            }
        }
    }

    #[test]
    fn spans_stay_inside_their_base() {
        let base = b"hello world";
        let span = Span::of(base, &base[6..]).unwrap();
        assert_eq!(span.get(base), b"world");
        assert_eq!(Span::of(base, b"elsewhere"), None);
        assert_eq!(Span::of(&base[..5], &base[3..8]), None);
        // A span read against a shorter buffer is empty, never a panic.
        assert_eq!(span.get(b"hi"), b"");
        // The 16-bit field spans answer as `Span::of` does.
        for (start, end) in [(0, 0), (0, 11), (3, 8), (6, 11), (11, 11), (2, 2)] {
            let part = &base[start..end];
            let short = short_span(base, part).map(|(at, len)| short_get(base, at, len));
            assert_eq!(short, Span::of(base, part).map(|s| s.get(base)));
        }
        assert_eq!(short_span(&base[..5], &base[3..8]), None);
        assert_eq!(short_span(&base[5..], &base[3..8]), None);
        assert_eq!(short_span(base, b"elsewhere"), None);
        assert_eq!(short_get(b"hi", 6, 5), b"");
    }

    #[test]
    fn locate_finds_the_first_empty_line_and_skips_leading_ones() {
        let buf = b"\r\n\r\nGET / HTTP/1.1\r\n\r\nbody\r\n\r\n";
        let at = locate(buf, 1024, StartLine::Request).unwrap().unwrap();
        assert_eq!(at, Located { skip: 4, len: 18 });
        assert_eq!(locate(b"\r\n\r", 1024, StartLine::Request), Ok(None));
        assert_eq!(locate(b"HTT", 1024, StartLine::Response), Ok(None));
        assert_eq!(
            locate(b"HTX", 1024, StartLine::Response),
            Err(HeadError::Malformed("invalid status line"))
        );
        // Fifteen bytes may still end within sixteen; sixteen without an end cannot.
        assert_eq!(
            locate(b"GET / HTTP/1.1\r", 16, StartLine::Request),
            Ok(None)
        );
        assert_eq!(
            locate(b"GET / HTTP/1.1\r\n", 16, StartLine::Request),
            Err(HeadError::TooLarge)
        );
        assert!(
            locate(b"GET / HTTP/1.1\r\n\r\n", 18, StartLine::Request)
                .unwrap()
                .is_some()
        );
    }
}
