//! Sans-IO HTTP/1.1 codec: owns the wire grammar of request and response heads, body framing
//! (length, chunked, close-delimited) and the head/chunk encoder. It never touches a socket:
//! callers hand it a `BytesMut` and get back `Partial | Complete` (heads) or a [`BodyEvent`]
//! (bodies), so every byte boundary can be tested and fuzzed without I/O.
//!
//! Choices (all of them anti-smuggling or anti-abuse; see RFC 9112):
//! - Heads are parsed by `httparse` into a stack array of [`MAX_HEADERS`] and stored as 16-bit
//!   spans into one zero-copy `Bytes` (every head is at most 64 KiB); there is one allocation
//!   per head (the span vector). Keeping up to 16 spans in place instead was counted
//!   dearer: the bigger heads cost more in moves than the allocation saved (perf/RESULTS.md,
//!   session 11).
//! - Line endings are strict CRLF, in heads, chunk-size lines and trailers alike. A bare LF is
//!   `Malformed("bare LF")`. (RFC 9112 §2.2 allows, but does not require, accepting bare LF.)
//! - A head already whole in the buffer (one read almost always brings it) is parsed by
//!   `httparse` straight away, and each of its lines is checked to end in CRLF. Anything else —
//!   a head not yet whole, one `httparse` refuses, a bare LF — goes the slow way, which
//!   defines the answer: the end of the head is found with a `memchr` scan of its line feeds
//!   before `httparse` runs, so a head that arrives in many reads is not re-parsed to its
//!   end on every read, and its first byte and line endings are checked early (a TLS
//!   handshake on the plain port fails at once). Both ways give the same head or error for
//!   the same bytes, however they are split (tested at every split and against each other).
//! - Up to [`MAX_HEAD_BYTES`] of leading empty lines (CRLF) before a request line are skipped;
//!   they count against the head limit.
//! - Requests: both `Transfer-Encoding` and `Content-Length` is [`HeadError::ConflictingFraming`];
//!   any transfer coding list other than exactly `chunked` is
//!   [`HeadError::UnsupportedTransferEncoding`], and so is any `Transfer-Encoding` in an
//!   HTTP/1.0 message (RFC 9112 §6.1); `Content-Length` must be digits, repeated values (as
//!   headers or as a list) must be identical; more than one `Host` header is malformed, a
//!   missing one is tolerated (we do not route by host).
//! - Responses follow RFC 9112 §6.3, except that any transfer coding other than exactly
//!   `chunked` is refused (we would forward content the client cannot decode) and TE together
//!   with CL is refused rather than letting TE win. Framing headers of bodiless responses
//!   (HEAD, 1xx, 204, 304) are ignored.
//! - Chunk extensions are validated and discarded; trailers are validated and discarded.

mod body;
mod encode;
mod head;
mod request;
mod response;

#[cfg(test)]
mod tests;

use std::fmt;

pub use body::{BodyDecoder, BodyEvent};
#[cfg(test)]
pub use encode::write_request_head;
pub use encode::{
    CONTINUE_100, Framing, Persist, is_hop_by_hop_name, is_listed, name_lengths, write_chunk,
    write_last_chunk, write_request_head_parts, write_response_head, write_response_head_bytes,
};
pub use request::{RequestHead, decode_request_head};
pub use response::{ResponseHead, decode_response_head};

/// Largest request head (request line, fields, final CRLF, plus any leading empty lines).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Largest upstream response head (each interim 1xx head is bounded separately).
pub const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields in one head.
pub const MAX_HEADERS: usize = 96;
/// Longest chunk-size line, including extensions and the CRLF.
pub const MAX_CHUNK_LINE_BYTES: usize = 1024;
/// Most bytes of trailer section after the last chunk, including the final CRLF.
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Outcome of a head decode: not enough bytes yet, or a whole head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded<T> {
    Partial,
    Complete(T),
}

/// Why a head was refused. Every variant maps to a 400-class answer downstream (or a 502
/// upstream); `Malformed` carries a fixed description for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// No complete head within the byte limit.
    TooLarge,
    /// More than [`MAX_HEADERS`] header fields.
    TooManyHeaders,
    /// The head does not follow the grammar.
    Malformed(&'static str),
    /// A `Content-Length` that is not digits, overflows, or disagrees with another one.
    BadContentLength,
    /// Both `Transfer-Encoding` and `Content-Length`.
    ConflictingFraming,
    /// A transfer coding list other than exactly `chunked`.
    UnsupportedTransferEncoding,
    /// Not HTTP/1.0 or HTTP/1.1 (including the HTTP/2 connection preface).
    UnsupportedVersion,
}

impl fmt::Display for HeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadError::TooLarge => f.write_str("head too large"),
            HeadError::TooManyHeaders => f.write_str("too many header fields"),
            HeadError::Malformed(what) => write!(f, "malformed head: {what}"),
            HeadError::BadContentLength => f.write_str("invalid content-length"),
            HeadError::ConflictingFraming => {
                f.write_str("both transfer-encoding and content-length")
            }
            HeadError::UnsupportedTransferEncoding => f.write_str("unsupported transfer-encoding"),
            HeadError::UnsupportedVersion => f.write_str("unsupported HTTP version"),
        }
    }
}

impl std::error::Error for HeadError {}

/// Why a body could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Chunk framing or trailers do not follow the grammar or exceed their limits.
    Malformed(&'static str),
    /// The peer closed before the body was complete.
    UnexpectedEof,
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::Malformed(what) => write!(f, "malformed body: {what}"),
            BodyError::UnexpectedEof => f.write_str("connection closed before the body ended"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Request method. Methods are case-sensitive; anything not listed is `Other` and its raw
/// token stays available through [`RequestHead::method_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Patch,
    Options,
    Other,
}

impl Method {
    /// The method token (`Other` is `"OTHER"`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Patch => "PATCH",
            Method::Options => "OPTIONS",
            Method::Other => "OTHER",
        }
    }

    /// Classifies a method token (case-sensitive, as RFC 9110 §9.1 says).
    pub fn from_bytes(token: &[u8]) -> Method {
        match token {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"PATCH" => Method::Patch,
            b"OPTIONS" => Method::Options,
            _ => Method::Other,
        }
    }
}

/// How the body of a message is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// No body at all.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the peer closes (responses only).
    CloseDelimited,
}
