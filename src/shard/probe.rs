//! Waiting for an owner's answer to a probe request: a shard-local slot per request,
//! completed by the message pump when the `ProbeReply` arrives.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use crate::resilience::breaker::ProbeTicket;

/// An owner's answer to one request of this shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Probe request: a ticket (the probe is ours), or none with a retry-after.
    Probe(Option<ProbeTicket>, u64),
    /// A failure outcome was applied and its views sent.
    Ack,
    /// Gate request: the permit's serial, or why not.
    Gate(Result<u64, crate::flow::gates::GateError>),
    /// Queue request: dispatch at this monotonic instant, or why not.
    Queue(Result<u64, crate::flow::queue::QueueError>),
    /// Queue request: the provider's sliding window is full; ask again at this instant.
    QueueRetry(u64),
    /// Quota-share selection: the candidates' order and the in-flight ticket.
    QuotaShare(Box<crate::runtime::msg::QsPick>),
}

#[derive(Debug, Default)]
struct Slot {
    answer: RefCell<Option<Answer>>,
    waker: RefCell<Option<Waker>>,
}

/// Outstanding probe requests of this shard.
#[derive(Debug, Default)]
pub struct ProbeWaiters {
    next_id: Cell<u64>,
    slots: RefCell<HashMap<u64, Rc<Slot>>>,
}

impl ProbeWaiters {
    /// Registers a waiter; returns its id and the future of its answer.
    pub fn register(&self) -> (u64, ProbeWait) {
        let id = self.next_id.get().wrapping_add(1);
        self.next_id.set(id);
        let slot = Rc::new(Slot::default());
        self.slots.borrow_mut().insert(id, slot.clone());
        (id, ProbeWait { slot })
    }

    /// Completes a waiter (a late reply for a forgotten id is ignored: returns false).
    pub fn complete(&self, id: u64, answer: Answer) -> bool {
        let Some(slot) = self.slots.borrow_mut().remove(&id) else {
            return false;
        };
        *slot.answer.borrow_mut() = Some(answer);
        if let Some(w) = slot.waker.borrow_mut().take() {
            w.wake();
        }
        true
    }

    /// Forgets a waiter that gave up.
    pub fn forget(&self, id: u64) {
        self.slots.borrow_mut().remove(&id);
    }
}

/// Resolves with the owner's answer.
#[derive(Debug)]
pub struct ProbeWait {
    slot: Rc<Slot>,
}

impl Future for ProbeWait {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let answer = self.slot.answer.borrow_mut().take();
        match answer {
            Some(a) => Poll::Ready(a),
            None => {
                *self.slot.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
