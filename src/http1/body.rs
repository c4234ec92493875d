//! Body framing: one small state machine for fixed-length, chunked (RFC 9112 §7.1) and
//! close-delimited bodies. Framing bytes (chunk-size lines, extensions, the CRLF after each
//! chunk, trailers) are consumed and dropped; content comes back as zero-copy `Bytes`.

use bytes::{Buf, Bytes, BytesMut};
use memchr::memchr;

use super::head::{is_field_value_byte, is_tchar};
use super::{BodyError, BodyKind, MAX_CHUNK_LINE_BYTES, MAX_TRAILER_BYTES};

/// One step of body decoding.
#[derive(Debug)]
pub enum BodyEvent {
    /// Body content; never empty.
    Data(Bytes),
    /// Everything buffered was consumed; read more (or call [`BodyDecoder::on_eof`]).
    NeedMore,
    /// The body is complete; bytes left in the buffer belong to the next message.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Length { remaining: u64 },
    ChunkSize,
    ChunkData { remaining: u64 },
    ChunkDataEnd,
    Trailers { seen: usize },
    CloseDelimited,
    Done,
}

/// Decodes a body of a given [`BodyKind`] from successive buffers.
#[derive(Clone, Debug)]
pub struct BodyDecoder {
    state: State,
}

const fn malformed(what: &'static str) -> BodyError {
    BodyError::Malformed(what)
}

impl BodyDecoder {
    pub fn new(kind: BodyKind) -> Self {
        let state = match kind {
            BodyKind::Empty | BodyKind::Length(0) => State::Done,
            BodyKind::Length(remaining) => State::Length { remaining },
            BodyKind::Chunked => State::ChunkSize,
            BodyKind::CloseDelimited => State::CloseDelimited,
        };
        BodyDecoder { state }
    }

    /// Decodes the next piece from `buf`, splitting consumed bytes off its front.
    ///
    /// `Data` is never empty. Once `Done` is returned, every later call returns `Done` and
    /// leaves `buf` alone. After an error the decoder's state is unspecified; drop it.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<BodyEvent, BodyError> {
        loop {
            match self.state {
                State::Done => return Ok(BodyEvent::Done),
                State::Length { remaining } => {
                    let Some((data, left)) = take(buf, remaining) else {
                        return Ok(BodyEvent::NeedMore);
                    };
                    self.state = if left == 0 {
                        State::Done
                    } else {
                        State::Length { remaining: left }
                    };
                    return Ok(BodyEvent::Data(data));
                }
                State::CloseDelimited => {
                    if buf.is_empty() {
                        return Ok(BodyEvent::NeedMore);
                    }
                    return Ok(BodyEvent::Data(buf.split().freeze()));
                }
                State::ChunkData { remaining } => {
                    let Some((data, left)) = take(buf, remaining) else {
                        return Ok(BodyEvent::NeedMore);
                    };
                    self.state = if left == 0 {
                        State::ChunkDataEnd
                    } else {
                        State::ChunkData { remaining: left }
                    };
                    return Ok(BodyEvent::Data(data));
                }
                State::ChunkSize => {
                    if let Some((size, used)) = plain_chunk_line(buf) {
                        if let Some(data) = whole_chunk(buf, size, used) {
                            return Ok(BodyEvent::Data(data));
                        }
                        buf.advance(used);
                        self.state = if size == 0 {
                            State::Trailers { seen: 0 }
                        } else {
                            State::ChunkData { remaining: size }
                        };
                        continue;
                    }
                    let window = buf
                        .get(..buf.len().min(MAX_CHUNK_LINE_BYTES))
                        .unwrap_or_default();
                    let Some(lf) = memchr(b'\n', window) else {
                        if buf.len() >= MAX_CHUNK_LINE_BYTES {
                            return Err(malformed("chunk-size line too long"));
                        }
                        return Ok(BodyEvent::NeedMore);
                    };
                    let size = parse_chunk_line(window.get(..lf).unwrap_or_default())?;
                    buf.advance(lf + 1);
                    self.state = if size == 0 {
                        State::Trailers { seen: 0 }
                    } else {
                        State::ChunkData { remaining: size }
                    };
                }
                State::ChunkDataEnd => match buf.get(..2) {
                    Some(b"\r\n") => {
                        buf.advance(2);
                        self.state = State::ChunkSize;
                    }
                    Some(_) => return Err(malformed("missing CRLF after chunk data")),
                    None => {
                        if buf.first().is_some_and(|&b| b != b'\r') {
                            return Err(malformed("missing CRLF after chunk data"));
                        }
                        return Ok(BodyEvent::NeedMore);
                    }
                },
                State::Trailers { seen } => {
                    let budget = MAX_TRAILER_BYTES.saturating_sub(seen);
                    let window = buf.get(..buf.len().min(budget)).unwrap_or_default();
                    let Some(lf) = memchr(b'\n', window) else {
                        if buf.len() >= budget {
                            return Err(malformed("trailer section too large"));
                        }
                        return Ok(BodyEvent::NeedMore);
                    };
                    let line = strip_cr(window.get(..lf).unwrap_or_default())?;
                    let last = line.is_empty();
                    if !last {
                        check_trailer_field(line)?;
                    }
                    buf.advance(lf + 1);
                    self.state = if last {
                        State::Done
                    } else {
                        State::Trailers {
                            seen: seen + lf + 1,
                        }
                    };
                }
            }
        }
    }

    /// The peer closed the connection. Ends a close-delimited body; anything else not yet done
    /// was truncated.
    pub fn on_eof(&mut self) -> Result<(), BodyError> {
        match self.state {
            State::Done => Ok(()),
            State::CloseDelimited => {
                self.state = State::Done;
                Ok(())
            }
            State::Length { .. }
            | State::ChunkSize
            | State::ChunkData { .. }
            | State::ChunkDataEnd
            | State::Trailers { .. } => Err(BodyError::UnexpectedEof),
        }
    }

    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Content bytes still expected for a fixed-length body (`None` for other kinds).
    #[cfg(test)]
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length { remaining } => Some(remaining),
            State::Done => Some(0),
            State::ChunkSize
            | State::ChunkData { .. }
            | State::ChunkDataEnd
            | State::Trailers { .. }
            | State::CloseDelimited => None,
        }
    }
}

/// Splits up to `remaining` (> 0) bytes off `buf`; `None` when `buf` is empty.
fn take(buf: &mut BytesMut, remaining: u64) -> Option<(Bytes, u64)> {
    if buf.is_empty() {
        return None;
    }
    let n = usize::try_from(remaining).map_or(buf.len(), |r| r.min(buf.len()));
    let data = buf.split_to(n).freeze();
    // n <= remaining, so this never saturates.
    Some((data, remaining.saturating_sub(n as u64)))
}

/// A chunk of `size` (> 0) bytes whose size line (`used` bytes) is at the start of `buf`,
/// when the whole of it and the CRLF after it are here: split off with its framing in one
/// step (the piece the chunk-data and CRLF states would give, one state walk per chunk
/// fewer). `None` (nothing taken) otherwise.
fn whole_chunk(buf: &mut BytesMut, size: u64, used: usize) -> Option<Bytes> {
    let n = usize::try_from(size).ok().filter(|&n| n > 0)?;
    let end = used.checked_add(n)?;
    if buf.get(end..end.checked_add(2)?) != Some(b"\r\n") {
        return None;
    }
    buf.advance(used);
    let data = buf.split_to(n).freeze();
    buf.advance(2);
    Some(data)
}

fn strip_cr(line: &[u8]) -> Result<&[u8], BodyError> {
    line.strip_suffix(b"\r").ok_or(malformed("bare LF"))
}

/// The usual chunk-size line at the start of `buf`, read without searching for its end: up
/// to 15 hex digits and CRLF. Its size and length; `None` for anything else (more digits,
/// an extension, whitespace, a bare LF, a line not all here yet), which
/// [`parse_chunk_line`] then reads as it reads every line.
fn plain_chunk_line(buf: &[u8]) -> Option<(u64, usize)> {
    let mut size: u64 = 0;
    for (i, &b) in buf.iter().enumerate().take(16) {
        let value = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            b'\r' if i > 0 => {
                return (buf.get(i + 1) == Some(&b'\n')).then_some((size, i + 2));
            }
            _ => return None,
        };
        // At most 15 digits come here: no overflow.
        size = (size << 4) | u64::from(value);
    }
    None
}

/// `chunk-size [ chunk-ext ] CRLF` without its LF; returns the size.
fn parse_chunk_line(line: &[u8]) -> Result<u64, BodyError> {
    let line = strip_cr(line)?;
    let mut size: u64 = 0;
    let mut digits = 0;
    for &b in line {
        let value = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => break,
        };
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(value)))
            .ok_or(malformed("chunk size overflows"))?;
        digits += 1;
    }
    if digits == 0 {
        return Err(malformed("invalid chunk size"));
    }
    let mut ext = line.get(digits..).unwrap_or_default();
    // chunk-ext = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-value ] ): whitespace only before ';'.
    while let [b' ' | b'\t', rest @ ..] = ext {
        ext = rest;
    }
    match ext {
        [] if digits == line.len() => Ok(size),
        [b';', rest @ ..] if rest.iter().all(|&b| is_field_value_byte(b)) => Ok(size),
        [b';', ..] => Err(malformed("invalid chunk extension")),
        _ => Err(malformed("invalid chunk size")),
    }
}

/// `field-name ":" OWS field-value OWS`, checked and then dropped.
fn check_trailer_field(line: &[u8]) -> Result<(), BodyError> {
    let Some(colon) = memchr(b':', line) else {
        return Err(malformed("invalid trailer field"));
    };
    let Some((name, value)) = line.split_at_checked(colon) else {
        return Err(malformed("invalid trailer field"));
    };
    if name.is_empty()
        || !name.iter().all(|&b| is_tchar(b))
        || !value.iter().skip(1).all(|&b| is_field_value_byte(b))
    {
        return Err(malformed("invalid trailer field"));
    }
    Ok(())
}
