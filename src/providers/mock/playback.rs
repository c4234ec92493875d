//! Playing a mock plan: the head after its delay (or never, within the response-head
//! budget), then the frames spaced by their gap, then the end of the body or silence —
//! the same shapes a real upstream gives the relay, on the shard's own timers.

use std::time::Duration;

use bytes::Bytes;

use super::{Frames, Plan};
use crate::error::{ErrorKind, GatewayError, TimeoutPhase};
use crate::http1::BodyKind;

/// The head of a mock answer.
#[derive(Clone, Debug)]
pub struct MockHead {
    pub status: u16,
    pub content_type: &'static str,
    pub extra: Vec<(&'static str, String)>,
    pub kind: BodyKind,
}

/// What the body has ready without waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ready {
    Piece(Bytes),
    /// Nothing yet (a gap or a stall).
    Empty,
    End,
}

/// The body of a mock answer.
#[derive(Debug)]
pub struct MockBody {
    frames: Frames,
    gap_ms: u64,
    sent: usize,
    stall: bool,
}

fn head_timeout(budget: Duration) -> GatewayError {
    GatewayError::new(
        ErrorKind::UpstreamTimeout(TimeoutPhase::ResponseHeader),
        format!(
            "no response head within {} ms (server.response_header_timeout_ms, per attempt)",
            budget.as_millis()
        ),
    )
}

fn idle_timeout(idle: Duration) -> GatewayError {
    GatewayError::new(
        ErrorKind::UpstreamTimeout(TimeoutPhase::BodyIdle),
        format!(
            "upstream body idle for {} ms (server.body_idle_timeout_ms)",
            idle.as_millis()
        ),
    )
}

/// Plays `plan` up to its head: waits its head delay, or the whole `header_budget` and
/// fails like an upstream that never answers.
pub async fn open(
    mut plan: Plan,
    header_budget: Duration,
) -> Result<(MockHead, MockBody), GatewayError> {
    if plan.stall_before_head {
        crate::timer::sleep(header_budget).await;
        return Err(head_timeout(header_budget));
    }
    if plan.head_delay_ms > 0 {
        let wait = Duration::from_millis(plan.head_delay_ms);
        if wait >= header_budget {
            crate::timer::sleep(header_budget).await;
            return Err(head_timeout(header_budget));
        }
        crate::timer::sleep(wait).await;
    }
    let kind = if plan.streamed {
        BodyKind::Chunked
    } else {
        BodyKind::Length(plan.frames.iter().map(|f| f.len() as u64).sum())
    };
    let frames = plan.take_frames();
    let head = MockHead {
        status: plan.status,
        content_type: plan.content_type,
        extra: plan.extra_headers,
        kind,
    };
    let body = MockBody {
        frames,
        gap_ms: plan.frame_delay_ms,
        sent: 0,
        stall: plan.stall_after_frames,
    };
    Ok((head, body))
}

impl MockBody {
    /// The next frame after its gap; after the last, the end — or, for a stalling plan,
    /// silence. A wait longer than `idle` is a body-idle timeout when `idle` passes, as
    /// from a network upstream.
    pub async fn next(&mut self, idle: Duration) -> Result<Option<Bytes>, GatewayError> {
        if let Some(f) = self.frames.next() {
            if self.sent > 0 && self.gap_ms > 0 {
                let gap = Duration::from_millis(self.gap_ms);
                if gap > idle {
                    crate::timer::sleep(idle).await;
                    return Err(idle_timeout(idle));
                }
                crate::timer::sleep(gap).await;
            }
            self.sent += 1;
            return Ok(Some(f));
        }
        if self.stall {
            crate::timer::sleep(idle).await;
            return Err(idle_timeout(idle));
        }
        Ok(None)
    }

    /// The next frame available without waiting.
    pub fn next_ready(&mut self) -> Ready {
        if self.gap_ms > 0 && self.sent > 0 {
            return Ready::Empty;
        }
        match self.frames.next() {
            Some(f) => {
                self.sent += 1;
                Ready::Piece(f)
            }
            None if self.stall => Ready::Empty,
            None => Ready::End,
        }
    }
}
