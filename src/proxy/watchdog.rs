//! The content-stall watchdog (spec B §7.1): an event stream that produces no
//! model-generated frame for `stream_watchdog.stall_timeout_ms` is abandoned. The budget is
//! armed when the answer's head arrives and re-armed only by frames the SSE scanner
//! classifies as model output (text, reasoning and signature deltas, tool calls, any
//! `*.delta`); pings, comments, `message_start`, role-only deltas, usage and pure error
//! frames do not count. Before the first client byte a stall is a 502
//! `stream_content_stall` and the attempt fails over; after it, the stream ends with an
//! in-band error event.
//!
//! The same scan feeds the throughput watchdog (spec B §7.2, `stream_recovery.
//! throughput_watchdog`, off by default): every piece's useful answer bytes go into a
//! sliding window ([`crate::sse::throughput::Meter`]) and the decision is taken on every
//! piece; reasoning and tool frames put the stream in a protected phase that is never
//! judged. An abort is a 502 `stream_throughput_too_low` before the first client byte (the
//! attempt fails over) and the in-band error after it.
//!
//! The same scan finds an error event the upstream sends in its stream (an OpenAI
//! `{"error":…}` chunk, an Anthropic `event: error`, a Responses `error` or
//! `response.failed`): the piece it is in is cut just past it, and the next read reports
//! the stream as failed ([`Watchdog::error_event`] keeps the event for classification).

use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::deadline::Deadline;
use super::upstream::Up;
use crate::error::{ErrorKind, GatewayError, TimeoutPhase};
use crate::owners::Req;
use crate::sse::throughput::{self, Decision, Meter, Policy};
use crate::sse::usage::Usage;
use crate::sse::{FrameKind, Marks, Scanner, classify};

/// Longest error event data kept for classification.
const MAX_ERROR_EVENT_BYTES: usize = 4 * 1024;

/// An error event the upstream sent in its stream: where it ended in the upstream's body
/// (bytes from the body's start) and its data (at most `MAX_ERROR_EVENT_BYTES`).
#[derive(Clone, Debug)]
pub struct ErrorEvent {
    pub end: u64,
    pub data: String,
}

/// Pre-output bytes (lifecycle frames) held back from the client at most; past this the
/// stream is committed even without model output.
const HOLD_BACK_MAX_BYTES: usize = 64 * 1024;

#[derive(Debug)]
pub struct Watchdog {
    scanner: Scanner,
    /// The content-stall budget; `None` when it is 0 (off).
    stall: Option<Duration>,
    /// Monotonic nanoseconds (the shard's clock) when the stall budget runs out
    /// (`u64::MAX` without one).
    deadline_ns: u64,
    /// A model-generated frame has been seen.
    output: bool,
    /// The clock reading of the last piece with model output.
    output_ns: u64,
    /// The throughput watchdog's meter, when it is enabled.
    throughput: Option<Meter>,
    /// The throughput decision that ended the stream, once one did.
    tripped: Option<Decision>,
    /// The last clock reading (one per piece observed).
    now_ns: u64,
    /// The token counts the stream reported.
    usage: Usage,
    /// Body bytes observed so far.
    scanned: u64,
    /// The first error event the upstream sent, once one came.
    error_event: Option<ErrorEvent>,
}

impl Watchdog {
    /// The watch over an event stream (`None` for anything else): the stall budget when it
    /// is not 0, the throughput meter when it is on, and the usage it reports in any case.
    pub fn arm(shard: &Req<'_>, event_stream: bool) -> Option<Watchdog> {
        let resilience = &shard.config().resilience;
        let tw = &resilience.stream_recovery.throughput_watchdog;
        if !event_stream {
            return None;
        }
        let throughput = tw.enabled.then_some(Policy {
            warmup_ms: tw.warmup_ms,
            window_ms: tw.window_ms,
            min_useful_bytes_per_second: tw.min_useful_bytes_per_second,
            min_useful_bytes: tw.min_useful_bytes,
        });
        Some(Watchdog::new(
            resilience.stream_watchdog.stall_timeout_ms,
            throughput,
            shard.mono_ns(),
        ))
    }

    /// A watch armed at `now_ns` with a stall budget of `stall_ms` (0: off) and the
    /// throughput watchdog's policy when it is on.
    pub fn new(stall_ms: u64, throughput: Option<Policy>, now_ns: u64) -> Watchdog {
        Watchdog {
            scanner: Scanner::default(),
            stall: (stall_ms > 0).then(|| Duration::from_millis(stall_ms)),
            deadline_ns: if stall_ms > 0 {
                now_ns.saturating_add(stall_ms.saturating_mul(1_000_000))
            } else {
                u64::MAX
            },
            output: false,
            output_ns: 0,
            throughput: throughput.map(Meter::new),
            tripped: None,
            now_ns,
            usage: Usage::default(),
            scanned: 0,
            error_event: None,
        }
    }

    /// Scans a piece received at `now_ns`; when it carries model output the stall budget
    /// is re-armed from `now_ns`. An event too large for the scanner is not classified; its
    /// bytes count as output (an upstream sending that much is not stalled). With the
    /// throughput watchdog on, the piece's useful bytes are recorded and the decision
    /// taken; an abort is kept for [`Watchdog::error`].
    ///
    /// Output is looked for only until one event shows some at this clock reading: every
    /// later event read at the same reading would re-arm the budget to the same instant
    /// (the pieces already buffered are observed at one reading). Past that, and without
    /// the stall budget, an event is classified only when it may be an error
    /// ([`crate::sse::Marks::may_be_error`]) and none came yet.
    pub fn observe(&mut self, piece: &[u8], now_ns: u64) {
        self.now_ns = now_ns;
        let stall = self.stall.is_some();
        let mut progress = self.output && self.output_ns == now_ns;
        let mut useful = 0u64;
        let meter = &mut self.throughput;
        let usage = &mut self.usage;
        let base = self.scanned;
        self.scanned = base.saturating_add(piece.len() as u64);
        let error_event = &mut self.error_event;
        self.scanner.feed_ends(piece, &mut |r, end| match r {
            Ok(ev) => {
                let marks = Marks::of(&ev);
                usage.observe_mentioned(&ev, marks.usage);
                let may_err = error_event.is_none() && marks.may_be_error;
                if (stall && !progress) || may_err {
                    let frame = classify(&ev);
                    progress |= frame.output;
                    if frame.kind == FrameKind::Error && error_event.is_none() {
                        let data = ev.data.unwrap_or_default();
                        let data = &data[..data.len().min(MAX_ERROR_EVENT_BYTES)];
                        *error_event = Some(ErrorEvent {
                            end: base.saturating_add(end as u64),
                            data: String::from_utf8_lossy(data).into_owned(),
                        });
                    }
                }
                if let Some(m) = meter.as_mut() {
                    useful += m.event(throughput::useful(&ev));
                }
            }
            Err(_) => progress = true,
        });
        if let Some(m) = self.throughput.as_mut() {
            let d = m.chunk(now_ns / 1_000_000, useful);
            if d.abort && self.tripped.is_none() {
                self.tripped = Some(d);
            }
        }
        if progress {
            self.output = true;
            self.output_ns = now_ns;
            if let Some(budget) = self.stall {
                let budget_ns = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX);
                self.deadline_ns = now_ns.saturating_add(budget_ns);
            }
        }
    }

    /// Holding lifecycle frames back: the stall budget is on and no model output came yet.
    fn holds_back(&self) -> bool {
        self.stall.is_some() && !self.output
    }

    /// The token counts the stream reported so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The throughput watchdog ended the stream.
    pub fn tripped(&self) -> bool {
        self.tripped.is_some()
    }

    /// The error event the upstream sent in its stream, if it sent one.
    pub fn error_event(&self) -> Option<&ErrorEvent> {
        self.error_event.as_ref()
    }

    /// `piece`, the last one observed, up to the end of the upstream's error event when that
    /// ended in it (what follows the error is not relayed).
    pub fn cut_at_error(&self, piece: Bytes) -> Bytes {
        let start = self.scanned.saturating_sub(piece.len() as u64);
        match &self.error_event {
            Some(e) if e.end > start && e.end < self.scanned => {
                let keep = usize::try_from(e.end - start).unwrap_or(piece.len());
                piece.slice(..keep.min(piece.len()))
            }
            _ => piece,
        }
    }

    /// The error that ends a stream whose upstream sent an error event.
    fn event_error(&self) -> GatewayError {
        GatewayError::new(
            ErrorKind::UpstreamProtocol,
            "the upstream sent an error event in its stream",
        )
    }

    /// The error that ends the stream: the throughput watchdog's, else the stall's.
    pub fn error(&self) -> GatewayError {
        match (&self.tripped, &self.throughput) {
            (Some(d), Some(m)) => {
                let p = m.policy();
                GatewayError::new(
                    ErrorKind::StreamThroughputTooLow,
                    format!(
                        "stream throughput too low: the upstream stream throughput stayed below \
                         the configured minimum ({:.1} useful bytes/s over the last {} ms, \
                         stream_recovery.throughput_watchdog.min_useful_bytes_per_second = {})",
                        d.rate_bytes_per_second, p.window_ms, p.min_useful_bytes_per_second
                    ),
                )
            }
            _ => self.stall_error(),
        }
    }

    /// The error when the stall budget runs out.
    fn stall_error(&self) -> GatewayError {
        let ms = self.stall.map_or(0, |b| b.as_millis());
        let message = if self.output {
            format!("stream content stall: no model output for {ms}ms")
        } else {
            format!(
                "stream content stall: no model output within {ms}ms (lifecycle/heartbeat events only)"
            )
        };
        GatewayError::new(ErrorKind::StreamContentStall, message)
    }
}

/// The next body piece within the body-idle budget, before the stall deadline (with a
/// stall budget) and before `deadline` (the attempt's hard deadline, or the overall
/// request deadline before the first client byte) — whichever comes first. A piece is
/// scanned before it is returned; one the throughput watchdog condemns is not returned, its
/// error is. The clock is read once per piece: the wait's stall budget counts from the last
/// piece's reading.
///
/// One bound ends the wait, whichever budget it is for: the body read's own (a deadline in
/// the connection's read-sweep slot, `net::watch`: no timer, ended within 10 ms), set to the
/// nearest of them, whose timeout is then reported as the budget that ran out. (A timer
/// per budget, each wrapping the one inside, made every stream's future larger by a monoio
/// timer entry apiece.)
pub async fn next(
    shard: &Req<'_>,
    up: &mut Up,
    idle: Duration,
    wd: Option<&mut Watchdog>,
    deadline: Option<Deadline>,
) -> Result<Option<Bytes>, GatewayError> {
    let mut budget = idle;
    let mut fires = Fires::Idle;
    if let Some(w) = wd.as_deref() {
        if w.tripped() {
            return Err(w.error());
        }
        if w.error_event.is_some() {
            return Err(w.event_error());
        }
        let left = Duration::from_nanos(w.deadline_ns.saturating_sub(w.now_ns));
        if left.is_zero() {
            return Err(w.error());
        }
        if left < budget {
            budget = left;
            fires = Fires::Stall;
        }
    }
    if let Some(d) = &deadline {
        let left = Duration::from_nanos(d.at_ns.saturating_sub(shard.now().mono_ns));
        if left.is_zero() {
            return Err(d.error());
        }
        if left < budget {
            budget = left;
            fires = Fires::Deadline;
        }
    }
    let got = match up.next(budget).await {
        Err(e) if e.kind == ErrorKind::UpstreamTimeout(TimeoutPhase::BodyIdle) => {
            return Err(match (fires, wd.as_deref(), &deadline) {
                (Fires::Stall, Some(w), _) => w.stall_error(),
                (Fires::Deadline, _, Some(d)) => d.error(),
                _ => e,
            });
        }
        got => got,
    };
    if let (Ok(Some(piece)), Some(w)) = (got.as_ref(), wd) {
        w.observe(piece, shard.mono_ns());
        if w.tripped() {
            return Err(w.error());
        }
        if w.error_event.is_some() {
            return got.map(|p| p.map(|p| w.cut_at_error(p)));
        }
    }
    got
}

/// Which budget bounds a wait in [`next`].
#[derive(Clone, Copy)]
enum Fires {
    Idle,
    Stall,
    Deadline,
}

/// Early recovery's hold-back (spec B §7.3, `stream_recovery.enabled`): the first bytes are
/// kept from the client until this long has passed since the first piece or this many
/// bytes are held, so a failure inside it is invisible and the attempt can still move on.
/// The window is checked as pieces arrive (a read is never cut short to end it: the body
/// reader is not cancel-safe), so it ends with the first piece after it.
#[derive(Clone, Copy, Debug)]
pub struct HoldBack {
    pub window_ns: u64,
    pub max_bytes: usize,
}

impl HoldBack {
    /// Hold-back before the first client byte: 750 ms.
    pub const WINDOW_MS: u64 = 750;
    /// Hold-back buffer: 64 KiB.
    pub const MAX_BYTES: usize = 64 * 1024;

    /// The hold-back when stream recovery is on.
    pub fn of(shard: &Req<'_>) -> Option<HoldBack> {
        shard
            .config()
            .resilience
            .stream_recovery
            .enabled
            .then_some(HoldBack {
                window_ns: Self::WINDOW_MS * 1_000_000,
                max_bytes: Self::MAX_BYTES,
            })
    }
}

/// Reads the first bytes to relay. Without a watchdog: the first piece. With one: pieces
/// are held back until one carries model output, the body ends, or the held bytes pass
/// `HOLD_BACK_MAX_BYTES`; a stall meanwhile is an error while nothing has reached the
/// client, so the attempt can fail over. Every read is bounded by `deadline` too. `None`
/// for an empty body.
pub async fn first_bytes(
    shard: &Req<'_>,
    up: &mut Up,
    idle: Duration,
    mut wd: Option<&mut Watchdog>,
    hold: Option<HoldBack>,
    deadline: Option<Deadline>,
) -> Result<Option<Bytes>, GatewayError> {
    let mut held: Option<Bytes> = None;
    let mut more = BytesMut::new();
    // When the first piece arrived (the recovery hold-back counts from it).
    let mut first_ns: Option<u64> = None;
    loop {
        let piece = match next(shard, up, idle, wd.as_deref_mut(), deadline).await? {
            Some(p) => p,
            None => break,
        };
        // An error event before anything reached the client fails the attempt (it may
        // move on).
        if let Some(w) = wd.as_deref()
            && w.error_event.is_some()
        {
            return Err(w.event_error());
        }
        match &held {
            None => held = Some(piece),
            Some(h) => {
                if more.is_empty() {
                    // One allocation for both (extending an empty buffer by the first
                    // sized it for that one alone, and the second regrew it).
                    more.reserve(h.len() + piece.len());
                    more.extend_from_slice(h);
                }
                more.extend_from_slice(&piece);
            }
        }
        let size = if more.is_empty() {
            held.as_ref().map_or(0, Bytes::len)
        } else {
            more.len()
        };
        if let Some(h) = hold {
            let now = shard.mono_ns();
            let since = now.saturating_sub(*first_ns.get_or_insert(now));
            if size < h.max_bytes && since < h.window_ns {
                continue;
            }
        }
        match wd.as_deref() {
            Some(w) if w.holds_back() && size < HOLD_BACK_MAX_BYTES => continue,
            _ => break,
        }
    }
    if !more.is_empty() {
        return Ok(Some(more.freeze()));
    }
    Ok(held)
}
