//! Typed owner calls: one request/reply layer for every owner-held mechanism.
//!
//! A shard asks a key's owner with [`Shard::call`]`::<P>(owner, request, bound)` and gets
//! `P::Reply` or a [`CallError`]. Every outstanding call of a shard sits in one waiter
//! table ([`Calls`]), keyed by an id unique across shards (the asking shard in its top 16
//! bits, so an owner knows where to answer). Giving up — the bound passes, or the caller's
//! future is dropped because its client hung up — abandons the waiter: for protocols whose
//! owner may hold a call ([`Protocol::HOLDS`], e.g. a gate waiter) the owner is told to
//! cancel it. A reply that arrives for an abandoned waiter goes to the application's late
//! hook ([`App::late_reply`]), which hands back whatever it grants (a permit, a slot, a
//! probe ticket), so nothing leaks when an asker gives up just as its grant is sent.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::{App, Msg, Shard};

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

/// One request/reply protocol of application `A`: its request and reply types, how they
/// travel inside `A`'s envelopes, and whether the owner may hold a call.
pub trait Protocol<A: App> {
    type Request;
    type Reply;
    /// The owner may keep the call waiting (a queue, a gate): giving up must cancel it.
    const HOLDS: bool;
    /// Names the protocol in a cancel.
    const KIND: A::Kind;
    fn wrap(request: Self::Request) -> A::Request;
    /// `None` when the reply belongs to another protocol (an owner bug).
    fn unwrap(reply: A::Reply) -> Option<Self::Reply>;
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

struct Slot<R> {
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
    fn register(&self, shard: usize) -> (CallId, Rc<Slot<R>>) {
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

    fn abandon(&self, id: CallId) {
        if let Some(w) = self.waiters.borrow_mut().get_mut(&id) {
            *w = Waiter::Abandoned;
        }
    }

    fn forget(&self, id: CallId) {
        self.waiters.borrow_mut().remove(&id);
    }

    /// Calls waiting for a reply, abandoned ones included.
    pub fn outstanding(&self) -> usize {
        self.waiters.borrow().len()
    }
}

struct Wait<R>(Rc<Slot<R>>);

impl<R> Future for Wait<R> {
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

/// A sent call not yet answered: dropped unanswered, it abandons the waiter and, when the
/// owner may hold the call, tells the owner to cancel it.
struct Pending<'s, A: App> {
    shard: &'s Shard<A>,
    owner: usize,
    id: CallId,
    kind: A::Kind,
    holds: bool,
    answered: bool,
}

impl<A: App> Drop for Pending<'_, A> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.shard.calls.abandon(self.id);
        if self.holds {
            let cancel = Msg::Cancel {
                id: self.id,
                kind: self.kind,
            };
            self.shard.send_reliable(self.owner, cancel);
        }
    }
}

impl<A: App> Shard<A> {
    /// Asks shard `owner` (this one included: self-calls go through the pump like any
    /// other) and waits at most `bound` for the reply.
    pub async fn call<P: Protocol<A>>(
        &self,
        owner: usize,
        request: P::Request,
        bound: Duration,
    ) -> Result<P::Reply, CallError> {
        self.call_with_id::<P>(owner, request, bound).await.1
    }

    /// [`Shard::call`], also giving the call's id (owners that hold what they grant, like
    /// a queue slot, know it by that id).
    pub async fn call_with_id<P: Protocol<A>>(
        &self,
        owner: usize,
        request: P::Request,
        bound: Duration,
    ) -> (CallId, Result<P::Reply, CallError>) {
        let (id, slot) = self.calls.register(self.id);
        (
            id,
            self.wait_reply::<P>(owner, id, slot, request, bound).await,
        )
    }

    async fn wait_reply<P: Protocol<A>>(
        &self,
        owner: usize,
        id: CallId,
        slot: Rc<Slot<A::Reply>>,
        request: P::Request,
        bound: Duration,
    ) -> Result<P::Reply, CallError> {
        let msg = Msg::Call {
            id,
            request: P::wrap(request),
        };
        if !self.send_reliable(owner, msg) {
            self.calls.forget(id);
            return Err(CallError::Unsent);
        }
        let mut pending = Pending {
            shard: self,
            owner,
            id,
            kind: P::KIND,
            holds: P::HOLDS,
            answered: false,
        };
        match monoio::time::timeout(bound, Wait(slot)).await {
            Ok(reply) => {
                pending.answered = true;
                P::unwrap(reply).ok_or(CallError::Mismatched)
            }
            Err(_) => Err(CallError::TimedOut),
        }
    }
}
