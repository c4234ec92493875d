//! Typed owner calls: one request/reply layer for every owner-held mechanism.
//!
//! A shard asks a key's owner with [`Shard::call`]`::<P>(owner, request, bound)` and gets
//! `P::Reply` or a [`CallError`]. Every outstanding call of a shard sits in one waiter
//! table (`Calls`), keyed by an id unique across shards (the asking shard in its top 16
//! bits, so an owner knows where to answer). Giving up — the bound passes, or the caller's
//! future is dropped because its client hung up — abandons the waiter: for protocols whose
//! owner may hold a call ([`Protocol::HOLDS`], e.g. a gate waiter) the owner is told to
//! cancel it. A reply that arrives for an abandoned waiter goes to the application's late
//! hook ([`App::late_reply`]), which hands back whatever it grants (a permit, a slot, a
//! probe ticket), so nothing leaks when an asker gives up just as its grant is sent. So
//! does a reply that arrived while the asker's future was not being polled and was never
//! read: the future was dropped first.

use std::rc::Rc;
use std::time::Duration;

use super::waiters::{Slot, Wait};
use super::{App, Msg, Shard};

#[cfg_attr(tidegate_reach, allow(unused_imports))] // owner tests and benches make call ids
pub use super::waiters::global_id;
pub use super::waiters::{CallError, CallId, caller_shard};

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

/// A sent call not yet answered: dropped unanswered, it abandons the waiter and, when the
/// owner may hold the call, tells the owner to cancel it — unless the reply is already in
/// its slot, unread, which then goes to the late hook.
struct Pending<'s, A: App> {
    shard: &'s Shard<A>,
    /// Where the pump puts the reply.
    slot: Rc<Slot<A::Reply>>,
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
        // The reply may have arrived after the asker's last poll: the pump took the waiter
        // out of the table, put the reply in the slot and woke the task, but the task
        // dropped the wait before polling it again (a request whose client hung up ends
        // while it reads the client's socket, not its admission). The owner has answered,
        // so there is nothing left there to cancel — a gate owner would keep the permit it
        // granted for good. What the reply grants goes back through the late hook, as if
        // it had arrived after the asker gave up.
        if let Some(reply) = self.slot.take_reply() {
            A::late_reply(self.shard, self.owner, self.id, reply);
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
            slot,
            owner,
            id,
            kind: P::KIND,
            holds: P::HOLDS,
            answered: false,
        };
        match crate::timer::timeout(bound, std::pin::pin!(Wait(&pending.slot))).await {
            Ok(reply) => {
                pending.answered = true;
                P::unwrap(reply).ok_or(CallError::Mismatched)
            }
            Err(_) => {
                // Every bound sits well past the time the owner answers by (its own
                // deadline, or at once): passing it means the request or the reply was
                // held up on the way (a starved thread, a lost wake-up). Say which call and
                // which owner, so an occurrence can be traced.
                tracing::warn!(
                    shard = self.id,
                    owner,
                    kind = ?P::KIND,
                    call = id,
                    bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
                    "owner call got no reply within its limit"
                );
                Err(CallError::TimedOut)
            }
        }
    }
}
