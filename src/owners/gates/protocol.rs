//! The gates protocol: permit calls to a connection's gate home, and the facts that return
//! or block them.

use crate::config::{ComboId, ConnectionId};
use crate::flow::gates::GateError;

pub enum Request {
    /// Every gate an attempt on `connection` for `model` needs, all or nothing, waiting
    /// until `deadline_ns` (monotonic; `None`: no deadline).
    Acquire {
        connection: ConnectionId,
        model: String,
        deadline_ns: Option<u64>,
    },
    /// The connection's quota-share slot (B §2.3; fail open) for an attempt of quota-share
    /// combo `combo` (its `queue_depth` bounds the waiters).
    QsSlot {
        combo: ComboId,
        connection: ConnectionId,
        deadline_ns: Option<u64>,
    },
    /// Round-robin combo `combo`'s semaphore for `model` on `connection` (B §2.2): capacity
    /// the connection's `max_concurrent`, else the combo's `concurrency_per_model`; at most
    /// `queue_depth` waiters (0: never wait). `capacity` and `queue_depth` are the asker's
    /// reading of them: the home uses them when its configuration does not have the combo
    /// (during a reload that added it, until the home adopts the reload).
    ComboSlot {
        combo: ComboId,
        connection: ConnectionId,
        model: String,
        deadline_ns: Option<u64>,
        capacity: u32,
        queue_depth: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Granted (now or when a permit came free); the serial names the permit.
    Granted(u64),
    /// Refused (queue full), timed out, or cancelled.
    Denied(GateError),
}

pub enum Fact {
    /// The attempt holding permit `serial` is over (exactly once).
    Release { serial: u64 },
    /// The upstream refused with a retry hint: block the connection's account gate (else
    /// its `model` gate) until `until_ns` (monotonic).
    Block {
        connection: ConnectionId,
        model: String,
        until_ns: u64,
    },
    /// The gate timer: a waiter deadline or a block end is due.
    Tick,
    /// The settings changed (a PATCH): apply the new capacities to the live gates now,
    /// admitting the waiters a rise lets in. Sent to every shard by the writer.
    Reconfigure,
}
