//! The waiter table of a shard's owner calls: call ids (unique across shards, the asking
//! shard in the top 16 bits), and one slot per outstanding call that its reply fills. Knows
//! nothing of the application or the shard: `call.rs` sends the calls and waits on these
//! slots; the shard's pump completes them.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// A call's id: unique across shards (asking shard in the top 16 bits).
pub type CallId = u64;

/// The shard that asked call `id` (where its reply goes).
pub fn caller_shard(id: CallId) -> usize {
    (id >> 48) as usize
}

/// The id of local call `local` of shard `shard`.
pub fn global_id(shard: usize, local: u64) -> CallId {
    ((shard as u64 & 0xffff) << 48) | (local & 0xffff_ffff_ffff)
}

/// Why a call produced no reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The owner's shard is gone (shutdown): the request could not be sent.
    Unsent,
    /// No reply within the bound (the owner was told to cancel).
    TimedOut,
    /// The owner answered with another protocol's reply.
    Mismatched,
}

pub(super) struct Slot<R> {
    reply: RefCell<Option<R>>,
    waker: RefCell<Option<Waker>>,
}

enum Waiter<R> {
    Waiting(Rc<Slot<R>>),
    /// The asker gave up; its reply, when it comes, goes to the late hook.
    Abandoned,
}

/// The outstanding calls of one shard.
pub struct Calls<R> {
    next: Cell<u64>,
    waiters: RefCell<HashMap<CallId, Waiter<R>>>,
}

impl<R> Default for Calls<R> {
    fn default() -> Self {
        Self {
            next: Cell::new(0),
            waiters: RefCell::new(HashMap::new()),
        }
    }
}

impl<R> Calls<R> {
    pub(super) fn register(&self, shard: usize) -> (CallId, Rc<Slot<R>>) {
        let local = self.next.get().wrapping_add(1);
        self.next.set(local);
        let id = global_id(shard, local);
        let slot = Rc::new(Slot {
            reply: RefCell::new(None),
            waker: RefCell::new(None),
        });
        self.waiters
            .borrow_mut()
            .insert(id, Waiter::Waiting(slot.clone()));
        (id, slot)
    }

    /// Hands `reply` to its waiter; gives it back when nobody waits for it any more.
    pub(super) fn complete(&self, id: CallId, reply: R) -> Option<R> {
        match self.waiters.borrow_mut().remove(&id) {
            Some(Waiter::Waiting(slot)) => {
                *slot.reply.borrow_mut() = Some(reply);
                if let Some(w) = slot.waker.borrow_mut().take() {
                    w.wake();
                }
                None
            }
            Some(Waiter::Abandoned) | None => Some(reply),
        }
    }

    pub(super) fn abandon(&self, id: CallId) {
        if let Some(w) = self.waiters.borrow_mut().get_mut(&id) {
            *w = Waiter::Abandoned;
        }
    }

    pub(super) fn forget(&self, id: CallId) {
        self.waiters.borrow_mut().remove(&id);
    }

    /// Calls waiting for a reply, abandoned ones included.
    #[cfg(test)]
    pub fn outstanding(&self) -> usize {
        self.waiters.borrow().len()
    }
}

impl<R> Slot<R> {
    /// The reply, if it arrived and nobody read it yet.
    pub(super) fn take_reply(&self) -> Option<R> {
        self.reply.borrow_mut().take()
    }
}

/// Resolves when the slot's reply arrives.
pub(super) struct Wait<'a, R>(pub(super) &'a Slot<R>);

impl<R> Future for Wait<'_, R> {
    type Output = R;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        match self.0.reply.borrow_mut().take() {
            Some(r) => Poll::Ready(r),
            None => {
                *self.0.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
