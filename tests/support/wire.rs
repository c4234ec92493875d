//! HTTP/1.1 framing shared by the mock upstream and the test client: header lookup, body
//! framing and an incremental chunked-body decoder. Written for the tests on purpose, apart from
//! the gateway's codec, so a bug there cannot hide behind the same bug here.

/// Most headers a head may carry before the parser gives up.
pub const MAX_HEADERS: usize = 128;
/// Largest head (request or status line plus headers) either side reads.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// First value of header `name` (case-insensitive).
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Every value of header `name` (case-insensitive), in order.
pub fn header_all<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// Whether any value of `name` lists `token` (comma-separated, case-insensitive), as in
/// `Connection: keep-alive, Upgrade`.
pub fn header_has_token(headers: &[(String, String)], name: &str, token: &str) -> bool {
    header_all(headers, name)
        .iter()
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

pub fn to_pairs(headers: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect()
}

/// How a message body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// Response body that runs until the peer closes.
    UntilClose,
}

/// Framing from headers (RFC 9112 §6). Requests without either header have an empty body;
/// `UntilClose` is only returned when `until_close_ok` (responses). Ambiguous or invalid
/// framing is an error, since a test harness must notice a peer that sends it.
pub fn framing(headers: &[(String, String)], until_close_ok: bool) -> Result<Framing, String> {
    let te = header_all(headers, "transfer-encoding");
    let cl = header_all(headers, "content-length");
    if !te.is_empty() {
        if !cl.is_empty() {
            return Err("both Transfer-Encoding and Content-Length".to_string());
        }
        let last = te
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .rfind(|t| !t.is_empty());
        return match last {
            Some(t) if t.eq_ignore_ascii_case("chunked") => Ok(Framing::Chunked),
            _ if until_close_ok => Ok(Framing::UntilClose),
            _ => Err(format!("Transfer-Encoding {te:?} does not end in chunked")),
        };
    }
    let mut length: Option<u64> = None;
    for v in cl.iter().flat_map(|v| v.split(',')) {
        let v = v.trim();
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("invalid Content-Length {v:?}"));
        }
        let n: u64 = v
            .parse()
            .map_err(|_| format!("Content-Length {v:?} out of range"))?;
        if length.is_some_and(|l| l != n) {
            return Err(format!("conflicting Content-Length values {cl:?}"));
        }
        length = Some(n);
    }
    match length {
        Some(n) => Ok(Framing::Length(n)),
        None if until_close_ok => Ok(Framing::UntilClose),
        None => Ok(Framing::Length(0)),
    }
}

/// One step of a chunked body.
#[derive(Debug, PartialEq, Eq)]
pub enum ChunkStep {
    /// A complete chunk's data, and how many input bytes it used.
    Data(Vec<u8>, usize),
    /// The last chunk and trailers, and how many input bytes they used.
    End(usize),
}

/// Decodes the next complete step from the start of `buf`; `Ok(None)` when more input is
/// needed. Strict: CRLF line ends, hex sizes, at most 16 digits.
pub fn next_chunk(buf: &[u8]) -> Result<Option<ChunkStep>, String> {
    let Some(line_end) = find_crlf(buf) else {
        return if buf.len() > 1024 {
            Err("chunk-size line longer than 1024 bytes".to_string())
        } else {
            Ok(None)
        };
    };
    let line = &buf[..line_end];
    let size_part = match line.iter().position(|&b| b == b';') {
        Some(i) => &line[..i],
        None => line,
    };
    let size_text = std::str::from_utf8(size_part)
        .map_err(|_| "chunk size is not text".to_string())?
        .trim_end_matches([' ', '\t']);
    if size_text.is_empty()
        || size_text.len() > 16
        || !size_text.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(format!("invalid chunk size {size_text:?}"));
    }
    let size = u64::from_str_radix(size_text, 16).map_err(|e| e.to_string())?;
    let data_start = line_end + 2;
    if size == 0 {
        // Trailer section: header lines until an empty line.
        let mut at = data_start;
        loop {
            let Some(end) = find_crlf(&buf[at..]) else {
                return Ok(None);
            };
            if end == 0 {
                return Ok(Some(ChunkStep::End(at + 2)));
            }
            at += end + 2;
        }
    }
    let size = usize::try_from(size).map_err(|_| "chunk too large".to_string())?;
    let data_end = data_start
        .checked_add(size)
        .ok_or_else(|| "chunk too large".to_string())?;
    if buf.len() < data_end + 2 {
        return Ok(None);
    }
    if &buf[data_end..data_end + 2] != b"\r\n" {
        return Err("chunk data not followed by CRLF".to_string());
    }
    Ok(Some(ChunkStep::Data(
        buf[data_start..data_end].to_vec(),
        data_end + 2,
    )))
}

/// Decodes a whole chunked body at the start of `buf`: `Ok(Some((body, used)))` once the last
/// chunk and trailers are there, `Ok(None)` while incomplete.
pub fn decode_chunked(buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, String> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        match next_chunk(&buf[at..])? {
            None => return Ok(None),
            Some(ChunkStep::Data(data, used)) => {
                body.extend_from_slice(&data);
                at += used;
            }
            Some(ChunkStep::End(used)) => return Ok(Some((body, at + used))),
        }
    }
}

pub fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// Encodes `data` as one chunk (empty data would end the body, so it encodes to nothing).
pub fn encode_chunk(data: &[u8]) -> Vec<u8> {
    if data.is_empty() {
        return Vec::new();
    }
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Reason phrase for the status codes tests use; anything else gets a generic one.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Overloaded",
        _ => "Status",
    }
}
