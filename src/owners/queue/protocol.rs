//! The queue protocol: slot calls to a connection's owner, and the facts that return slots
//! and teach the queue. What an answer teaches travels as numbers (`ResponseFacts`), read
//! on the shard that saw the answer.

use crate::config::ConnectionId;
use crate::flow::queue::{QueueError, ResponseFacts};

pub enum Request {
    /// A slot in the connection's request queue, after a start in its provider's window.
    Acquire {
        connection: ConnectionId,
        model: String,
        /// When this request first asked (monotonic ns): bounds its wait for the
        /// provider's sliding window before it fails open (B §1.2b).
        waiting_since_ns: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The slot is held; dispatch at `start_at_ns` (monotonic).
    Granted { start_at_ns: u64 },
    /// The provider's sliding window is full; ask again at `at_ns`.
    Retry { at_ns: u64 },
    /// Queue full, queue-wait timeout, wedged, or cancelled.
    Denied(QueueError),
}

pub enum Fact {
    /// The attempt holding the slot of call `id` is over (exactly once), with what its
    /// successful answer taught.
    Finish {
        id: u64,
        learned: Option<ResponseFacts>,
    },
    /// An error answer on `connection` for `model` teaches its queue.
    Learn {
        connection: ConnectionId,
        model: String,
        facts: ResponseFacts,
    },
    /// A limiter's next wake-up: expire overdue waiters, grant the next.
    Tick { key: String },
}
