//! The content-stall watchdog (spec B §7.1): an event stream that produces no
//! model-generated frame for `stream_watchdog.stall_timeout_ms` is abandoned. The budget is
//! armed when the answer's head arrives and re-armed only by frames the SSE scanner
//! classifies as model output (text, reasoning and signature deltas, tool calls, any
//! `*.delta`); pings, comments, `message_start`, role-only deltas, usage and pure error
//! frames do not count. Before the first client byte a stall is a 502
//! `stream_content_stall` and the attempt fails over; after it, the stream ends with an
//! in-band error event.

use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::upstream::Up;
use crate::error::{ErrorKind, GatewayError};
use crate::owners::Shard;
use crate::sse::{Scanner, classify};

/// Pre-output bytes (lifecycle frames) held back from the client at most; past this the
/// stream is committed even without model output.
const HOLD_BACK_MAX_BYTES: usize = 64 * 1024;

#[derive(Debug)]
pub struct Watchdog {
    scanner: Scanner,
    budget: Duration,
    /// Monotonic nanoseconds (the shard's clock) when the budget runs out.
    deadline_ns: u64,
    /// A model-generated frame has been seen.
    output: bool,
}

impl Watchdog {
    /// The watchdog of an answer: only for event streams, and only when the budget is not 0.
    pub fn arm(shard: &Shard, event_stream: bool) -> Option<Watchdog> {
        let ms = shard.config().resilience.stream_watchdog.stall_timeout_ms;
        if !event_stream || ms == 0 {
            return None;
        }
        let budget = Duration::from_millis(ms);
        Some(Watchdog {
            scanner: Scanner::default(),
            budget,
            deadline_ns: shard
                .now()
                .mono_ns
                .saturating_add(ms.saturating_mul(1_000_000)),
            output: false,
        })
    }

    /// Scans a piece; true when it carried model output (the budget is re-armed). An
    /// event too large for the scanner is not classified; its bytes count as output (an
    /// upstream sending that much is not stalled).
    pub fn observe(&mut self, piece: &[u8], now_ns: u64) -> bool {
        let mut progress = false;
        self.scanner.feed(piece, &mut |r| match r {
            Ok(ev) => progress |= classify(&ev).output,
            Err(_) => progress = true,
        });
        if progress {
            self.output = true;
            let budget_ns = u64::try_from(self.budget.as_nanos()).unwrap_or(u64::MAX);
            self.deadline_ns = now_ns.saturating_add(budget_ns);
        }
        progress
    }

    pub fn saw_output(&self) -> bool {
        self.output
    }

    /// The error when the budget runs out.
    pub fn stall_error(&self) -> GatewayError {
        let ms = self.budget.as_millis();
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

/// The next body piece within the body-idle budget and, with a watchdog, before the stall
/// deadline (whichever comes first). A piece is scanned before it is returned.
pub async fn next(
    shard: &Shard,
    up: &mut Up,
    idle: Duration,
    wd: Option<&mut Watchdog>,
) -> Result<Option<Bytes>, GatewayError> {
    let Some(wd) = wd else {
        return up.next(idle).await;
    };
    let left = Duration::from_nanos(wd.deadline_ns.saturating_sub(shard.now().mono_ns));
    if left.is_zero() {
        return Err(wd.stall_error());
    }
    let got = if left >= idle {
        up.next(idle).await
    } else {
        match monoio::time::timeout(left, up.next(idle)).await {
            Ok(r) => r,
            Err(_) => return Err(wd.stall_error()),
        }
    };
    if let Ok(Some(piece)) = &got {
        wd.observe(piece, shard.now().mono_ns);
    }
    got
}

/// Reads the first bytes to relay. Without a watchdog: the first piece. With one: pieces
/// are held back until one carries model output, the body ends, or the held bytes pass
/// [`HOLD_BACK_MAX_BYTES`]; a stall meanwhile is an error while nothing has reached the
/// client, so the attempt can fail over. `None` for an empty body.
pub async fn first_bytes(
    shard: &Shard,
    up: &mut Up,
    idle: Duration,
    mut wd: Option<&mut Watchdog>,
) -> Result<Option<Bytes>, GatewayError> {
    let mut held: Option<Bytes> = None;
    let mut more = BytesMut::new();
    loop {
        let piece = match next(shard, up, idle, wd.as_deref_mut()).await? {
            Some(p) => p,
            None => break,
        };
        match &held {
            None => held = Some(piece),
            Some(h) => {
                if more.is_empty() {
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
        match wd.as_deref() {
            Some(w) if !w.saw_output() && size < HOLD_BACK_MAX_BYTES => continue,
            _ => break,
        }
    }
    if !more.is_empty() {
        return Ok(Some(more.freeze()));
    }
    Ok(held)
}
