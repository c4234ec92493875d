//! Sans-IO server-sent events: a [`Scanner`] that cuts a byte stream into events however the
//! bytes are split (LF or CRLF line ends, a blank line ends an event, `data:` lines joined
//! with `\n`), and [`classify`] that names what an event carries for the three streaming
//! shapes the gateway relays (OpenAI chat, OpenAI Responses, Anthropic Messages).
//!
//! The scanner never owns a complete event that arrived inside one piece: it is parsed where
//! it lies. Only an event cut by a piece boundary is copied, into one reused buffer, and that
//! buffer is bounded: an event longer than the scanner's limit is reported once as
//! [`SseError::EventTooLarge`] and skipped up to its end. Multi-line `data` is joined into a
//! second reused buffer. Nothing is allocated per byte or, once the buffers are warm, per
//! event.

mod classify;
mod marks;
mod scan;
#[cfg(test)]
mod tests;
pub mod throughput;
pub mod usage;

pub use classify::classify;
#[cfg_attr(tidegate_reach, allow(unused_imports))] // the fuzz target names the frame types
pub use classify::{Frame, FrameKind};
pub use marks::Marks;

/// Default limit of one event, terminating blank line included.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 256 * 1024;

/// One event: its `event:` name (the last one), its `data:` lines joined with `\n`, and
/// whether it had comment lines (`:` first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event<'a> {
    pub name: Option<&'a [u8]>,
    pub data: Option<&'a [u8]>,
    pub comment: bool,
}

impl Event<'_> {
    /// An event with no field and no comment (blank lines only) carries nothing.
    pub fn is_empty(&self) -> bool {
        self.name.is_none() && self.data.is_none() && !self.comment
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SseError {
    /// An event longer than the limit (bytes); it is skipped up to its end.
    EventTooLarge { limit: usize },
}

impl std::fmt::Display for SseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SseError::EventTooLarge { limit } => {
                write!(f, "server-sent event longer than {limit} bytes")
            }
        }
    }
}

/// Where the current line stands: nothing yet, a lone `\r`, or content (not blank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    Start,
    Cr,
    Content,
}

impl Line {
    fn after(self, part: &[u8]) -> Line {
        match (self, part) {
            (s, []) => s,
            (Line::Start, b"\r") => Line::Cr,
            _ => Line::Content,
        }
    }
}

/// Cuts a byte stream into events. Feed pieces with [`Scanner::feed`]; each complete event
/// (or an oversize error) is handed to the callback in order.
#[derive(Debug)]
pub struct Scanner {
    /// The start of an event cut by a piece boundary.
    pending: Vec<u8>,
    /// Scratch for multi-line `data`.
    joined: Vec<u8>,
    line: Line,
    /// Skipping the rest of an oversize event.
    discarding: bool,
    max_event: usize,
}

impl Default for Scanner {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl Scanner {
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            pending: Vec::new(),
            joined: Vec::new(),
            line: Line::Start,
            discarding: false,
            max_event: max_event_bytes.max(2),
        }
    }

    /// Bytes held for an incomplete event (at most the limit).
    #[cfg(any(test, fuzzing))]
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Scans `input`, calling `on` for every event that ends in it.
    pub fn feed(&mut self, input: &[u8], on: &mut impl FnMut(Result<Event<'_>, SseError>)) {
        self.feed_ends(input, &mut |r, _| on(r));
    }

    /// As [`Scanner::feed`], with where in `input` each event ended (the offset just past
    /// its blank line).
    pub fn feed_ends(
        &mut self,
        input: &[u8],
        on: &mut impl FnMut(Result<Event<'_>, SseError>, usize),
    ) {
        let mut start = 0;
        let mut pos = 0;
        // An event that begins in `input` is read line by line as its lines are found here
        // (`fields`), not searched for its lines again once it ends; one begun in an earlier
        // piece (or being skipped) is read from `pending` whole. Only the first event of
        // `input` can be such.
        let mut fresh = self.pending.is_empty() && !self.discarding;
        let mut fields = Fields::default();
        loop {
            // The next line end; a blank line right after a line end (the usual end of an
            // event) is seen without a search, and the end of the input (the usual end of a
            // piece) without a call.
            let lf = match input.get(pos..) {
                Some([b'\n', ..]) => pos,
                Some([b'\r', b'\n', ..]) => pos + 1,
                Some([]) | None => break,
                Some(rest) => match memchr::memchr(b'\n', rest) {
                    Some(i) => pos + i,
                    None => break,
                },
            };
            let line = &input[pos..lf];
            let blank = self.line.after(line) != Line::Content;
            self.line = Line::Start;
            pos = lf + 1;
            if !blank {
                if fresh {
                    fields.line(line, &mut self.joined);
                }
                continue;
            }
            let read = std::mem::take(&mut fields);
            let was_fresh = std::mem::replace(&mut fresh, true);
            let piece = &input[start..pos];
            start = pos;
            if self.discarding {
                self.discarding = false;
                self.pending.clear();
                continue;
            }
            if self.pending.len() + piece.len() > self.max_event {
                self.pending.clear();
                on(
                    Err(SseError::EventTooLarge {
                        limit: self.max_event,
                    }),
                    pos,
                );
                continue;
            }
            let ev = if was_fresh {
                read.event(&self.joined)
            } else {
                self.pending.extend_from_slice(piece);
                parse(&self.pending, &mut self.joined)
            };
            if !ev.is_empty() {
                on(Ok(ev), pos);
            }
            self.pending.clear();
        }
        self.line = self.line.after(&input[pos..]);
        let tail = &input[start..];
        if self.discarding || tail.is_empty() {
            return;
        }
        if self.pending.len() + tail.len() > self.max_event {
            self.pending.clear();
            self.discarding = true;
            on(
                Err(SseError::EventTooLarge {
                    limit: self.max_event,
                }),
                input.len(),
            );
            return;
        }
        self.pending.extend_from_slice(tail);
    }
}

/// Parses one complete event (its lines and the blank line that ends it).
fn parse<'a>(raw: &'a [u8], joined: &'a mut Vec<u8>) -> Event<'a> {
    // The lines as `raw.split(|&b| b == b'\n')` gives them, found with memchr (SIMD)
    // rather than by a closure per byte (~1 200 instructions per event before).
    let mut start = 0;
    let ends = memchr::memchr_iter(b'\n', raw).chain(std::iter::once(raw.len()));
    let lines = ends.map(move |end| {
        let line = raw.get(start..end).unwrap_or_default();
        start = end + 1;
        line
    });
    event_of_lines(lines, joined)
}

/// The event that `lines` (split on `\n`, a trailing `\r` still on) make.
fn event_of_lines<'a>(lines: impl Iterator<Item = &'a [u8]>, joined: &'a mut Vec<u8>) -> Event<'a> {
    let mut fields = Fields::default();
    for line in lines {
        fields.line(line, joined);
    }
    fields.event(joined)
}

/// An event's fields as its lines are read: the last `event:` name, the first `data:` line
/// (later ones are joined in the scanner's buffer), whether it had a comment.
#[derive(Default)]
struct Fields<'a> {
    name: Option<&'a [u8]>,
    first: Option<&'a [u8]>,
    lines_of_data: usize,
    comment: bool,
}

impl<'a> Fields<'a> {
    /// Reads one line (split on `\n`, a trailing `\r` still on); a second and later `data`
    /// line is joined into `joined`.
    #[inline]
    fn line(&mut self, line: &'a [u8], joined: &mut Vec<u8>) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(&first_byte) = line.first() else {
            return;
        };
        if first_byte == b':' {
            self.comment = true;
            return;
        }
        let (field, value) = match line.strip_prefix(b"data:") {
            // The usual line, without a search for its colon.
            Some(v) => (&line[..4], v.strip_prefix(b" ").unwrap_or(v)),
            None => match memchr::memchr(b':', line) {
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (line, &line[line.len()..]),
            },
        };
        match field {
            b"event" => self.name = Some(value),
            b"data" => {
                self.lines_of_data += 1;
                match self.lines_of_data {
                    1 => self.first = Some(value),
                    2 => {
                        joined.clear();
                        joined.extend_from_slice(self.first.unwrap_or_default());
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                    }
                    _ => {
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                    }
                }
            }
            _ => {}
        }
    }

    /// The event read, its data joined in `joined` when it had more than one line.
    fn event<'b>(self, joined: &'b [u8]) -> Event<'b>
    where
        'a: 'b,
    {
        let data = if self.lines_of_data > 1 {
            Some(joined)
        } else {
            self.first
        };
        Event {
            name: self.name,
            data,
            comment: self.comment,
        }
    }
}
