//! The shard mesh: the only path a message takes from one shard to another.
//!
//! [`Mesh::build`] makes, at start-up, an N×N grid of bounded single-producer /
//! single-consumer rings — one per ordered pair of shards, the diagonal included — and
//! returns one [`MeshEnd`] per shard, to be moved into that shard's thread. An end owns the
//! producer side of its N outbound rings and the consumer side of its N inbound rings; nothing
//! else can touch them, so each ring has exactly one writer and one reader and needs no lock
//! (glommio's `SharesManager` mesh, iggy's shard frames).
//!
//! What this module owns, and the contract it keeps (ARCHITECTURE.md §1.2, §3):
//!
//! - **A send never blocks.** [`MeshSender::try_send`] either enqueues, or hands the message
//!   back with a [`DropReason`] and bumps a per-(from, to) counter in [`MeshStats`], readable
//!   from any thread for `/metrics` (`frame_drops_total{reason}`). [`MeshSender::send`] is the
//!   same with the reason left out. Callers that must not drop silently (permit and lease
//!   requests) use `try_send` and map the reason to a typed response.
//! - **Sending to yourself** goes through the diagonal ring: a bounded local FIFO with the same
//!   capacity, the same drop rule and the same counters as any other pair, so a one-shard
//!   gateway behaves exactly like a 64-shard one.
//! - **Receiving is fair and cancel-safe.** [`MeshReceiver::try_recv`] takes one message per
//!   call, round-robin over the inbound rings, so one chatty peer cannot starve the others.
//!   [`MeshReceiver::recv`] parks the shard's pump until a message arrives; dropping the future
//!   (e.g. in `monoio::select!`) loses nothing, because a message is only taken when it is
//!   returned.
//! - **Ownership by type.** A [`MeshEnd`] and its halves are `Send` (built on the main thread,
//!   moved into the shard thread) but not `Sync` and not `Clone`: one thread holds each
//!   producer and each consumer, which is exactly what the SPSC rings rely on. Share a
//!   [`MeshSender`] between the tasks of one shard with an `Rc`; a [`MeshReceiver`] belongs to
//!   the shard's single pump task (`recv` takes `&mut self`, so two tasks cannot both park on
//!   it and steal each other's wake-ups).
//!
//! # The ring
//!
//! A classic Lamport ring with cached indices: the consumer's `head` and the producer's
//! `tail` grow monotonically (wrapping `usize`) and live on separate 128-byte lines; each side
//! keeps a private copy of the other side's index and re-reads the shared one only when the
//! copy says "full" (producer) or "empty" (consumer). A push is one slot write plus one
//! `Release` store; a pop is one `Acquire` load (only when the cached tail is exhausted), one
//! slot read, one `Release` store. Capacity is a power of two ([`RING_CAPACITY`] by default),
//! so a slot index is `i & mask`.
//!
//! Memory: `N² × capacity × size_of::<T>()`, allocated at start-up (4096 rings for 64
//! shards; the slots are uninitialised, so pages are typically touched only as rings fill).
//! Keep mesh messages small (ids and numbers, not bodies) and use [`Mesh::with_capacity`] to
//! shrink rings for large shard counts.
//!
//! # Wake-ups
//!
//! Every consumer has an `Inbox` with a one-slot atomic waker (the `atomic-waker` crate, the
//! futures-rs `AtomicWaker`: a tiny state machine `WAITING | REGISTERING | WAKING` that never
//! blocks either side) and a `parked` flag. A parking consumer registers its waker, sets `parked`, issues a
//! `SeqCst` fence and re-checks its rings; a producer, after publishing its push, issues a
//! `SeqCst` fence and reads `parked`. By the fence rule one of them sees the other's write: either
//! the consumer finds the message, or the producer finds `parked` and wakes it (one producer
//! claims the wake by swapping `parked` to false). When the consumer is busy, a send costs no
//! waker traffic at all. monoio's `sync` feature makes its wakers callable from foreign threads:
//! the wake is queued to the owning runtime and its driver unparked (eventfd). The tests run two
//! real runtimes on two threads to check exactly that.
//!
//! # Why there is `unsafe` here (and only in the private `raw` module)
//!
//! A ring of generic `T` needs slots that one thread writes and another later reads with no
//! lock between them. Safe Rust offers no such cell: the safe candidates were a
//! `Mutex<Option<T>>` per slot (a lock on every message, ruled out by §1.1 "no `Mutex` on the
//! request path", and two more atomic read-modify-writes per message) or an `AtomicPtr` slot
//! holding a `Box<T>` (still needs `unsafe` for `Box::from_raw`, plus an allocation per message).
//! So the rings use `UnsafeCell` in the private `raw` module, the only item
//! in this file where `unsafe_code` is allowed. Every `unsafe` block carries a `SAFETY` note
//! naming the protocol step that makes it sound; the tests below hammer the rings from several
//! threads with heap-owning messages, tiny capacities and drops of non-empty rings.

use std::future::poll_fn;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::task::{Context, Poll};

use std::cell::Cell;

use atomic_waker::AtomicWaker;
use raw::{Consumer, Padded, Producer};

/// Slots per ring unless [`Mesh::with_capacity`] says otherwise (a power of two).
#[cfg_attr(tidegate_reach, allow(dead_code))]
pub const RING_CAPACITY: usize = 1024;
/// Largest ring [`Mesh::with_capacity`] builds; larger requests are clamped to it.
pub const MAX_RING_CAPACITY: usize = 1 << 16;

/// Why a send handed its message back. A closed set: it is the `reason` label of
/// `frame_drops_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The ring to that shard was full (the receiver is behind).
    RingFull,
    /// The receiving shard has dropped its receiver (it is shutting down).
    PeerClosed,
    /// The destination is not a shard of this mesh (a caller bug; counted, not a panic).
    NoSuchShard,
}

impl DropReason {
    /// Every reason, in label order.
    pub const ALL: [DropReason; 3] = [
        DropReason::RingFull,
        DropReason::PeerClosed,
        DropReason::NoSuchShard,
    ];

    /// The Prometheus label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::RingFull => "ring_full",
            DropReason::PeerClosed => "peer_closed",
            DropReason::NoSuchShard => "no_such_shard",
        }
    }
}

/// A message the mesh would not take, handed back with the reason.
pub struct Rejected<T> {
    pub reason: DropReason,
    pub msg: T,
}

impl<T> std::fmt::Debug for Rejected<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rejected")
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

/// Drop counters of one pair of shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(tidegate_reach, allow(dead_code))]
pub struct PairDrops {
    pub ring_full: u64,
    pub peer_closed: u64,
}

/// Drop counters of the whole mesh. Each counter is written only by its sending shard
/// (relaxed increments) and read by anyone (`/metrics` sums on read).
#[derive(Debug)]
pub struct MeshStats {
    shards: usize,
    /// `[(from * shards + to) * 2 + {0: ring_full, 1: peer_closed}]`.
    pairs: Box<[AtomicU64]>,
    /// `[from]`: sends to a shard index outside the mesh.
    no_such_shard: Box<[AtomicU64]>,
}

impl MeshStats {
    fn new(shards: usize) -> Self {
        Self {
            shards,
            pairs: (0..shards * shards * 2)
                .map(|_| AtomicU64::new(0))
                .collect(),
            no_such_shard: (0..shards).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Shards in the mesh.
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn shards(&self) -> usize {
        self.shards
    }

    fn pair_slot(&self, from: usize, to: usize, reason: DropReason) -> Option<&AtomicU64> {
        if from >= self.shards || to >= self.shards {
            return None;
        }
        let column = match reason {
            DropReason::RingFull => 0,
            DropReason::PeerClosed => 1,
            DropReason::NoSuchShard => return None,
        };
        self.pairs.get((from * self.shards + to) * 2 + column)
    }

    fn count(&self, from: usize, to: usize, reason: DropReason) {
        let slot = match reason {
            DropReason::RingFull | DropReason::PeerClosed => self.pair_slot(from, to, reason),
            DropReason::NoSuchShard => self.no_such_shard.get(from),
        };
        if let Some(c) = slot {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Messages `from` could not hand to `to` (zeros for indices outside the mesh).
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn pair(&self, from: usize, to: usize) -> PairDrops {
        let read = |reason| {
            self.pair_slot(from, to, reason)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        };
        PairDrops {
            ring_full: read(DropReason::RingFull),
            peer_closed: read(DropReason::PeerClosed),
        }
    }

    /// Messages `from` could not send, for one reason, summed over destinations.
    pub fn sender(&self, from: usize, reason: DropReason) -> u64 {
        match reason {
            DropReason::RingFull | DropReason::PeerClosed => (0..self.shards)
                .filter_map(|to| self.pair_slot(from, to, reason))
                .map(|c| c.load(Ordering::Relaxed))
                .sum(),
            DropReason::NoSuchShard => self
                .no_such_shard
                .get(from)
                .map_or(0, |c| c.load(Ordering::Relaxed)),
        }
    }

    /// Messages dropped mesh-wide for one reason: the value of `frame_drops_total{reason}`.
    pub fn total(&self, reason: DropReason) -> u64 {
        (0..self.shards).map(|from| self.sender(from, reason)).sum()
    }
}

/// What producers need to know about one consumer: how to wake it, and whether it is gone.
#[derive(Default)]
struct Inbox {
    waker: AtomicWaker,
    /// Set by the consumer just before it parks; a producer that swaps it back to false owns
    /// the wake-up.
    parked: AtomicBool,
    /// Set when the consumer's receiver is dropped.
    closed: AtomicBool,
}

struct Shared {
    inboxes: Box<[Padded<Inbox>]>,
    stats: Arc<MeshStats>,
}

/// Builds meshes. A namespace type: `Mesh::<Msg>::build(shards)`.
pub struct Mesh<T>(PhantomData<fn() -> T>);

impl<T> Mesh<T> {
    /// One end per shard (index = shard id), with rings of [`RING_CAPACITY`] slots.
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn build(shards: usize) -> Vec<MeshEnd<T>> {
        Self::with_capacity(shards, RING_CAPACITY)
    }

    /// One end per shard, with rings of `capacity` slots, rounded up to a power of two and
    /// clamped to `1..=`[`MAX_RING_CAPACITY`].
    pub fn with_capacity(shards: usize, capacity: usize) -> Vec<MeshEnd<T>> {
        let capacity = capacity
            .clamp(1, MAX_RING_CAPACITY)
            .checked_next_power_of_two()
            .unwrap_or(MAX_RING_CAPACITY);
        let shared = Arc::new(Shared {
            inboxes: (0..shards).map(|_| Padded::default()).collect(),
            stats: Arc::new(MeshStats::new(shards)),
        });
        let mut outbound: Vec<Vec<Producer<T>>> =
            (0..shards).map(|_| Vec::with_capacity(shards)).collect();
        let mut inbound: Vec<Vec<Consumer<T>>> =
            (0..shards).map(|_| Vec::with_capacity(shards)).collect();
        for producers in &mut outbound {
            // Ring (from, to): `from` is this row, `to` the column; the consumer side goes to
            // `to`'s inbound list, at position `from` (rows are visited in order).
            for consumers in &mut inbound {
                let (p, c) = raw::channel(capacity);
                producers.push(p);
                consumers.push(c);
            }
        }
        outbound
            .into_iter()
            .zip(inbound)
            .enumerate()
            .map(|(id, (out, inb))| MeshEnd {
                sender: MeshSender {
                    id,
                    outbound: out.into_boxed_slice(),
                    shared: shared.clone(),
                },
                receiver: MeshReceiver {
                    id,
                    inbound: inb.into_boxed_slice(),
                    cursor: Cell::new(0),
                    shared: shared.clone(),
                },
            })
            .collect()
    }
}

/// One shard's end of the mesh: its sender and its receiver. Move it into the shard's
/// thread, then use it directly or [`split`](MeshEnd::split) it.
///
/// ```
/// use tidegate::mesh::ring::Mesh;
///
/// let ends = Mesh::<&str>::build(2);
/// ends[0].send(1, "breaker opened").unwrap();
/// assert_eq!(ends[1].try_recv(), Some((0, "breaker opened")));
/// ```
///
/// An end cannot be shared between threads (each ring has one producer and one consumer):
///
/// ```compile_fail,E0277
/// fn shared<X: Sync>(_: &X) {}
/// let ends = tidegate::mesh::ring::Mesh::<u8>::build(2);
/// shared(&ends[0]);
/// ```
pub struct MeshEnd<T> {
    sender: MeshSender<T>,
    receiver: MeshReceiver<T>,
}

impl<T> MeshEnd<T> {
    /// This shard's index.
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn id(&self) -> usize {
        self.sender.id
    }

    /// Shards in the mesh.
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn shards(&self) -> usize {
        self.sender.shards()
    }

    /// See [`MeshSender::send`].
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn send(&self, to: usize, msg: T) -> Result<(), T> {
        self.sender.send(to, msg)
    }

    /// See [`MeshSender::try_send`].
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn try_send(&self, to: usize, msg: T) -> Result<(), Rejected<T>> {
        self.sender.try_send(to, msg)
    }

    /// See [`MeshReceiver::try_recv`].
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn try_recv(&self) -> Option<(usize, T)> {
        self.receiver.try_recv()
    }

    /// See [`MeshReceiver::poll_recv`].
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<(usize, T)> {
        self.receiver.poll_recv(cx)
    }

    /// See [`MeshReceiver::recv`].
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub async fn recv(&mut self) -> (usize, T) {
        self.receiver.recv().await
    }

    /// The mesh's drop counters (shared by every end; keep a clone for `/metrics`).
    pub fn stats(&self) -> &Arc<MeshStats> {
        self.sender.stats()
    }

    /// The sending half (shared by the shard's tasks) and the receiving half (owned by its
    /// pump).
    pub fn split(self) -> (MeshSender<T>, MeshReceiver<T>) {
        (self.sender, self.receiver)
    }
}

/// The producer side of one shard's outbound rings. `Send`, not `Sync`, not `Clone`.
pub struct MeshSender<T> {
    id: usize,
    /// Indexed by destination shard (the diagonal is this shard's local queue).
    outbound: Box<[Producer<T>]>,
    shared: Arc<Shared>,
}

impl<T> MeshSender<T> {
    /// This shard's index.
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn id(&self) -> usize {
        self.id
    }

    /// Shards in the mesh.
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn shards(&self) -> usize {
        self.outbound.len()
    }

    /// The mesh's drop counters.
    pub fn stats(&self) -> &Arc<MeshStats> {
        &self.shared.stats
    }

    /// Enqueues `msg` for shard `to` without blocking, or hands it back (and counts the drop).
    pub fn send(&self, to: usize, msg: T) -> Result<(), T> {
        self.try_send(to, msg).map_err(|r| r.msg)
    }

    /// Enqueues `msg` for shard `to` without blocking, or hands it back with the reason (and
    /// counts the drop under that reason). Wakes the receiver if it is parked.
    pub fn try_send(&self, to: usize, msg: T) -> Result<(), Rejected<T>> {
        let (Some(producer), Some(inbox)) = (self.outbound.get(to), self.shared.inboxes.get(to))
        else {
            return Err(self.reject(to, DropReason::NoSuchShard, msg));
        };
        if inbox.closed.load(Ordering::Relaxed) {
            return Err(self.reject(to, DropReason::PeerClosed, msg));
        }
        if let Err(msg) = producer.push(msg) {
            return Err(self.reject(to, DropReason::RingFull, msg));
        }
        // Dekker handshake with `MeshReceiver::poll_recv`: our push (a `Release` store of
        // the tail) is ordered before this fence, the consumer's `parked = true` before its
        // fence; whichever fence comes second sees the other side's write.
        fence(Ordering::SeqCst);
        if inbox.parked.load(Ordering::Relaxed) && inbox.parked.swap(false, Ordering::AcqRel) {
            inbox.waker.wake();
        }
        Ok(())
    }

    fn reject(&self, to: usize, reason: DropReason, msg: T) -> Rejected<T> {
        self.shared.stats.count(self.id, to, reason);
        Rejected { reason, msg }
    }
}

/// The consumer side of one shard's inbound rings. `Send`, not `Sync`, not `Clone`.
pub struct MeshReceiver<T> {
    id: usize,
    /// Indexed by source shard.
    inbound: Box<[Consumer<T>]>,
    /// Where the next fair scan starts.
    cursor: Cell<usize>,
    shared: Arc<Shared>,
}

impl<T> MeshReceiver<T> {
    /// This shard's index.
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn id(&self) -> usize {
        self.id
    }

    /// Takes one message, if any, as `(from, msg)`. Scans the inbound rings round-robin,
    /// starting after the ring that delivered last, so every peer gets its turn.
    pub fn try_recv(&self) -> Option<(usize, T)> {
        let n = self.inbound.len();
        let start = self.cursor.get();
        for k in 0..n {
            let from = (start + k) % n;
            if let Some(msg) = self.inbound.get(from).and_then(Consumer::pop) {
                self.cursor.set((from + 1) % n);
                return Some((from, msg));
            }
        }
        None
    }

    /// Ready with a message, or registers the task to be woken when one arrives.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<(usize, T)> {
        if let Some(m) = self.try_recv() {
            return Poll::Ready(m);
        }
        let Some(inbox) = self.shared.inboxes.get(self.id) else {
            // Unreachable (every receiver has an inbox); an end with no inbox never wakes.
            return Poll::Pending;
        };
        inbox.waker.register(cx.waker());
        inbox.parked.store(true, Ordering::SeqCst);
        // Pairs with the fence in `MeshSender::try_send` (see there).
        fence(Ordering::SeqCst);
        match self.try_recv() {
            Some(m) => {
                inbox.parked.store(false, Ordering::Relaxed);
                Poll::Ready(m)
            }
            None => Poll::Pending,
        }
    }

    /// Waits until any inbound ring has a message and returns it as `(from, msg)`.
    /// Cancel-safe: dropping the future takes nothing.
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub async fn recv(&mut self) -> (usize, T) {
        poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl<T> Drop for MeshReceiver<T> {
    fn drop(&mut self) {
        if let Some(inbox) = self.shared.inboxes.get(self.id) {
            inbox.closed.store(true, Ordering::Relaxed);
        }
    }
}

/// The lock-free piece that needs `UnsafeCell`: the SPSC ring. Nothing outside this module
/// can reach a slot.
#[allow(unsafe_code)]
mod raw {
    use std::cell::{Cell, UnsafeCell};
    use std::mem::MaybeUninit;
    use std::ops::Deref;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Keeps a value on its own pair of cache lines (128 bytes: x86's adjacent-line
    /// prefetcher pulls lines in pairs), so a producer's writes never evict a consumer's.
    #[derive(Default)]
    #[repr(align(128))]
    pub(super) struct Padded<T>(pub(super) T);

    impl<T> Deref for Padded<T> {
        type Target = T;
        fn deref(&self) -> &T {
            &self.0
        }
    }

    /// A bounded SPSC ring. `head` (next slot to read) is written only by the consumer,
    /// `tail` (next slot to write) only by the producer; both only grow (wrapping). Slots in
    /// `head..tail` hold initialised values owned by the ring; the others are vacant.
    struct Ring<T> {
        head: Padded<AtomicUsize>,
        tail: Padded<AtomicUsize>,
        mask: usize,
        slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    }

    // SAFETY: the ring moves `T` values from the producer's thread to the consumer's, so `T`
    // must be `Send`; it never hands out `&T`, so `T: Sync` is not needed. Concurrent access
    // to a slot is excluded by the index protocol (see `push` and `pop`): a slot is written
    // only while vacant, by the unique producer, and read only while full, by the unique
    // consumer, with a Release/Acquire pair on `tail` or `head` between the two.
    unsafe impl<T: Send> Sync for Ring<T> {}

    impl<T> Ring<T> {
        fn slot(&self, index: usize) -> &UnsafeCell<MaybeUninit<T>> {
            &self.slots[index & self.mask]
        }
    }

    impl<T> Drop for Ring<T> {
        fn drop(&mut self) {
            let head = *self.head.0.get_mut();
            let tail = *self.tail.0.get_mut();
            let mut i = head;
            while i != tail {
                // SAFETY: `&mut self` means neither handle exists any more; slots in
                // `head..tail` were written by `push` and not yet read by `pop` (every push and
                // pop publishes its index before returning), so each is initialised and owned
                // by the ring, and is dropped exactly once here.
                unsafe { (*self.slot(i).get()).assume_init_drop() };
                i = i.wrapping_add(1);
            }
        }
    }

    /// A ring of `capacity` slots (a power of two, at least 1) and its two unique handles.
    pub(super) fn channel<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
        let capacity = capacity.max(1).next_power_of_two();
        let ring = Arc::new(Ring {
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            mask: capacity - 1,
            slots: (0..capacity)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
        });
        (
            Producer {
                ring: ring.clone(),
                tail: Cell::new(0),
                head_seen: Cell::new(0),
            },
            Consumer {
                ring,
                head: Cell::new(0),
                tail_seen: Cell::new(0),
            },
        )
    }

    /// The only writer of a ring. Not `Clone`, not `Sync` (its `Cell`s): at most one thread
    /// can call `push`, and `push` runs no foreign code, so it is never re-entered.
    pub(super) struct Producer<T> {
        ring: Arc<Ring<T>>,
        /// Our own `ring.tail` (we are its only writer).
        tail: Cell<usize>,
        /// The last `ring.head` we read; the real one is never behind it.
        head_seen: Cell<usize>,
    }

    impl<T> Producer<T> {
        pub(super) fn push(&self, value: T) -> Result<(), T> {
            let ring = &*self.ring;
            let tail = self.tail.get();
            let capacity = ring.mask.wrapping_add(1);
            if tail.wrapping_sub(self.head_seen.get()) >= capacity {
                // Acquire: the consumer's read of the slot we are about to reuse happened
                // before its Release store of this head.
                let head = ring.head.0.load(Ordering::Acquire);
                self.head_seen.set(head);
                if tail.wrapping_sub(head) >= capacity {
                    return Err(value);
                }
            }
            // SAFETY: `tail - head < capacity`, so slot `tail` is vacant: the consumer only
            // reads slots below the published tail (which is still `tail`), and it finished
            // reading this slot's previous value before publishing a head past it (Acquire
            // above, or an earlier Acquire that saw an even later head). We are the only
            // producer, so nobody else writes it.
            unsafe { (*ring.slot(tail).get()).write(value) };
            // Release: publishes the slot's contents with the new tail.
            ring.tail.0.store(tail.wrapping_add(1), Ordering::Release);
            self.tail.set(tail.wrapping_add(1));
            Ok(())
        }
    }

    /// The only reader of a ring. Not `Clone`, not `Sync`.
    pub(super) struct Consumer<T> {
        ring: Arc<Ring<T>>,
        /// Our own `ring.head` (we are its only writer).
        head: Cell<usize>,
        /// The last `ring.tail` we read; the real one is never behind it.
        tail_seen: Cell<usize>,
    }

    impl<T> Consumer<T> {
        pub(super) fn pop(&self) -> Option<T> {
            let ring = &*self.ring;
            let head = self.head.get();
            if head == self.tail_seen.get() {
                // Acquire: pairs with the producer's Release store of the tail, so the slot
                // contents it published are visible to us.
                let tail = ring.tail.0.load(Ordering::Acquire);
                self.tail_seen.set(tail);
                if head == tail {
                    return None;
                }
            }
            // SAFETY: `head < tail` as last acquired, so the producer initialised slot `head`
            // and published it (Release/Acquire on `tail`); it will not write the slot again
            // until we publish a head past it. We are the only consumer, and we move the value
            // out exactly once: the head moves past it below before anyone can read it again.
            let value = unsafe { (*ring.slot(head).get()).assume_init_read() };
            // Release: our read of the slot happens before the producer reuses it.
            ring.head.0.store(head.wrapping_add(1), Ordering::Release);
            self.head.set(head.wrapping_add(1));
            Some(value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Wake, Waker};
    use std::time::Duration;

    fn assert_send<X: Send>() {}

    /// Message counts for the multi-thread tests: full size natively, small under Miri (which
    /// runs the same interleaving-sensitive code, checking every access, far more slowly).
    fn scaled(n: u64) -> u64 {
        if cfg!(miri) { (n / 500).max(20) } else { n }
    }

    #[test]
    fn ends_and_halves_are_send() {
        assert_send::<MeshEnd<String>>();
        assert_send::<MeshSender<String>>();
        assert_send::<MeshReceiver<String>>();
        assert_send::<Arc<MeshStats>>();
    }

    #[test]
    fn capacity_is_a_power_of_two() {
        for (asked, got) in [(0, 1), (1, 1), (3, 4), (4, 4), (1000, 1024)] {
            let ends = Mesh::<u32>::with_capacity(2, asked);
            let mut sent = 0;
            while ends[0].send(1, 7).is_ok() {
                sent += 1;
            }
            assert_eq!(sent, got, "asked for {asked}");
        }
        let ends = Mesh::<u8>::with_capacity(1, usize::MAX);
        let mut sent = 0;
        while ends[0].send(0, 1).is_ok() {
            sent += 1;
        }
        assert_eq!(sent, MAX_RING_CAPACITY);
    }

    #[test]
    fn messages_arrive_in_order_per_pair_with_their_source() {
        let ends = Mesh::<u32>::build(3);
        for i in 0..10 {
            ends[0].send(2, i).unwrap();
        }
        for i in 0..10 {
            assert_eq!(ends[2].try_recv(), Some((0, i)));
        }
        assert_eq!(ends[2].try_recv(), None);
        assert_eq!(ends[0].try_recv(), None);
        assert_eq!(ends[1].try_recv(), None);
    }

    #[test]
    fn a_full_ring_hands_the_message_back_and_counts_it() {
        let ends = Mesh::<String>::with_capacity(2, 4);
        for i in 0..4 {
            ends[0].send(1, i.to_string()).unwrap();
        }
        assert_eq!(ends[0].send(1, "x".into()), Err("x".to_string()));
        let r = ends[0].try_send(1, "y".into()).unwrap_err();
        assert_eq!(r.reason, DropReason::RingFull);
        assert_eq!(r.msg, "y");
        let stats = ends[1].stats();
        assert_eq!(
            stats.pair(0, 1),
            PairDrops {
                ring_full: 2,
                peer_closed: 0
            }
        );
        assert_eq!(stats.pair(1, 0), PairDrops::default());
        assert_eq!(stats.total(DropReason::RingFull), 2);
        assert_eq!(stats.sender(0, DropReason::RingFull), 2);
        // Other pairs are unaffected; draining one slot frees one.
        ends[1].send(0, "back".into()).unwrap();
        assert_eq!(ends[1].try_recv(), Some((0, "0".to_string())));
        ends[0].send(1, "4".into()).unwrap();
        let got: Vec<String> = std::iter::from_fn(|| ends[1].try_recv().map(|(_, m)| m)).collect();
        assert_eq!(got, ["1", "2", "3", "4"]);
    }

    #[test]
    fn sending_to_yourself_is_a_bounded_local_queue() {
        let ends = Mesh::<u8>::with_capacity(1, 2);
        ends[0].send(0, 1).unwrap();
        ends[0].send(0, 2).unwrap();
        assert_eq!(ends[0].send(0, 3), Err(3));
        assert_eq!(ends[0].stats().pair(0, 0).ring_full, 1);
        assert_eq!(ends[0].try_recv(), Some((0, 1)));
        assert_eq!(ends[0].try_recv(), Some((0, 2)));
        assert_eq!(ends[0].try_recv(), None);
    }

    #[test]
    fn unknown_shards_and_closed_peers_are_counted_not_panics() {
        let mut ends = Mesh::<u8>::build(2);
        let r = ends[0].try_send(5, 9).unwrap_err();
        assert_eq!((r.reason, r.msg), (DropReason::NoSuchShard, 9));
        assert_eq!(ends[0].stats().sender(0, DropReason::NoSuchShard), 1);
        assert_eq!(ends[0].stats().total(DropReason::NoSuchShard), 1);
        assert_eq!(ends[0].stats().pair(0, 5), PairDrops::default());

        let one = ends.pop().unwrap();
        let stats = one.stats().clone();
        let (_tx, rx) = one.split();
        drop(rx);
        let r = ends[0].try_send(1, 3).unwrap_err();
        assert_eq!(r.reason, DropReason::PeerClosed);
        assert_eq!(stats.pair(0, 1).peer_closed, 1);
        assert_eq!(stats.total(DropReason::PeerClosed), 1);
        // The closed shard can still send.
        _tx.send(0, 4).unwrap();
        assert_eq!(ends[0].try_recv(), Some((1, 4)));
    }

    #[test]
    fn drop_reasons_are_a_closed_label_set() {
        let labels: Vec<&str> = DropReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, ["ring_full", "peer_closed", "no_such_shard"]);
    }

    #[test]
    fn try_recv_takes_turns_between_sources() {
        let ends = Mesh::<(usize, u32)>::build(4);
        for from in [0, 1, 3] {
            for i in 0..5 {
                ends[from].send(2, (from, i)).unwrap();
            }
        }
        let order: Vec<usize> = std::iter::from_fn(|| ends[2].try_recv().map(|(f, _)| f))
            .take(9)
            .collect();
        assert_eq!(order, [0, 1, 3, 0, 1, 3, 0, 1, 3]);
    }

    /// Counts live instances, to prove every message is dropped exactly once.
    struct Tracked(Arc<AtomicUsize>);
    impl Tracked {
        fn new(live: &Arc<AtomicUsize>) -> Self {
            live.fetch_add(1, Ordering::SeqCst);
            Tracked(live.clone())
        }
    }
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn messages_left_in_rings_are_dropped_with_the_mesh() {
        let live = Arc::new(AtomicUsize::new(0));
        {
            let ends = Mesh::<Tracked>::with_capacity(3, 4);
            for end in &ends {
                for to in 0..3 {
                    for _ in 0..6 {
                        // Two of every six come back (ring full) and drop here.
                        let _ = end.send(to, Tracked::new(&live));
                    }
                }
            }
            assert_eq!(live.load(Ordering::SeqCst), 9 * 4);
            // Take some, wrap some rings around, leave the rest.
            for _ in 0..5 {
                drop(ends[1].try_recv());
            }
            // Ring 0→1 gave up two of those five slots: two of these fit, one comes back.
            let accepted = (0..3)
                .filter(|_| ends[0].send(1, Tracked::new(&live)).is_ok())
                .count();
            assert_eq!(accepted, 2);
            assert_eq!(live.load(Ordering::SeqCst), 9 * 4 - 5 + 2);
        }
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    /// A waker that counts its wakes and unparks a thread.
    struct ThreadWaker {
        thread: std::thread::Thread,
        wakes: AtomicUsize,
    }
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.wakes.fetch_add(1, Ordering::SeqCst);
            self.thread.unpark();
        }
    }

    fn thread_waker() -> (Arc<ThreadWaker>, Waker) {
        let w = Arc::new(ThreadWaker {
            thread: std::thread::current(),
            wakes: AtomicUsize::new(0),
        });
        (w.clone(), Waker::from(w))
    }

    /// Blocks the calling thread on `poll_recv`, parking between polls (a minimal executor).
    fn block_recv<T>(rx: &mut MeshReceiver<T>, waker: &Waker) -> (usize, T) {
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(m) = rx.poll_recv(&mut cx) {
                return m;
            }
            std::thread::park();
        }
    }

    #[test]
    fn a_send_wakes_a_parked_receiver_once_and_a_busy_one_never() {
        let ends = Mesh::<u32>::build(2);
        let mut ends = ends.into_iter();
        let (a, b) = (ends.next().unwrap(), ends.next().unwrap());
        let (_, mut rx) = b.split();
        let (counter, waker) = thread_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending());
        a.send(1, 1).unwrap();
        a.send(1, 2).unwrap();
        assert_eq!(counter.wakes.load(Ordering::SeqCst), 1, "one wake per park");
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready((0, 1)));
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready((0, 2)));
        // Not parked: sends cost no wake.
        assert_eq!(rx.try_recv(), None);
        a.send(1, 3).unwrap();
        assert_eq!(counter.wakes.load(Ordering::SeqCst), 1);
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready((0, 3)));
    }

    #[test]
    fn a_self_send_wakes_the_local_pump() {
        let mut ends = Mesh::<u32>::build(1);
        let end = ends.pop().unwrap();
        let (tx, mut rx) = end.split();
        let (counter, waker) = thread_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending());
        tx.send(0, 5).unwrap();
        assert_eq!(counter.wakes.load(Ordering::SeqCst), 1);
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready((0, 5)));
    }

    /// Runs `f` on a thread and fails (instead of hanging) if it has not finished in time.
    fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            f();
            let _ = done_tx.send(());
        });
        match done_rx.recv_timeout(Duration::from_secs(secs)) {
            Ok(()) => handle.join().unwrap(),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                // The body panicked; surface its panic.
                if let Err(p) = handle.join() {
                    std::panic::resume_unwind(p);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("did not finish within {secs} s (lost wake-up or livelock)")
            }
        }
    }

    /// Every shard sends `per_pair` numbered heap-owning messages to every shard (itself
    /// included) through rings of `capacity`, retrying when full, while draining its own
    /// inbox; every receiver checks per-source FIFO order and completeness.
    fn stress(shards: usize, capacity: usize, per_pair: u64) {
        let ends = Mesh::<Box<(usize, u64, String)>>::with_capacity(shards, capacity);
        let stats = ends[0].stats().clone();
        let barrier = Arc::new(std::sync::Barrier::new(shards));
        let handles: Vec<_> = ends
            .into_iter()
            .map(|end| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let me = end.id();
                    let mut next_seq = vec![0u64; shards];
                    let mut received = 0u64;
                    let expected = per_pair * shards as u64;
                    let mut check = |from: usize, msg: Box<(usize, u64, String)>| {
                        let (src, seq, text) = *msg;
                        assert_eq!(src, from, "source label");
                        assert_eq!(seq, next_seq[from], "FIFO from {from} to {me}");
                        assert_eq!(text, format!("{from}->{me}#{seq}"));
                        next_seq[from] += 1;
                    };
                    barrier.wait();
                    for seq in 0..per_pair {
                        for k in 0..shards {
                            let to = (me + k) % shards;
                            let mut msg = Box::new((me, seq, format!("{me}->{to}#{seq}")));
                            loop {
                                match end.try_send(to, msg) {
                                    Ok(()) => break,
                                    Err(r) => {
                                        assert_eq!(r.reason, DropReason::RingFull);
                                        msg = r.msg;
                                        // Make room in our own inbox so peers (and we) progress.
                                        while let Some((from, m)) = end.try_recv() {
                                            check(from, m);
                                            received += 1;
                                        }
                                        std::thread::yield_now();
                                    }
                                }
                            }
                        }
                    }
                    while received < expected {
                        match end.try_recv() {
                            Some((from, m)) => {
                                check(from, m);
                                received += 1;
                            }
                            None => std::thread::yield_now(),
                        }
                    }
                    assert_eq!(end.try_recv().map(|(f, _)| f), None);
                    // Hold the end until everyone is done (dropping it closes our inbox).
                    barrier.wait();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(stats.total(DropReason::PeerClosed), 0);
        assert_eq!(stats.total(DropReason::NoSuchShard), 0);
    }

    #[test]
    fn stress_four_threads_tiny_rings() {
        within(120, || stress(4, 2, scaled(20_000)));
    }

    #[test]
    fn stress_two_threads_capacity_one() {
        within(120, || stress(2, 1, scaled(50_000)));
    }

    #[test]
    fn stress_eight_threads_default_rings() {
        within(120, || stress(8, RING_CAPACITY, scaled(5_000)));
    }

    /// Two threads, each blocking on `poll_recv` with a thread-parking waker, bounce one
    /// token back and forth: any lost wake-up hangs (and `within` fails the test).
    #[test]
    fn ping_pong_with_parked_receivers_never_loses_a_wake_up() {
        within(120, || {
            let rounds = scaled(50_000) & !1;
            let mut ends = Mesh::<u64>::with_capacity(2, 2).into_iter();
            let (a, b) = (ends.next().unwrap(), ends.next().unwrap());
            let pong = std::thread::spawn(move || {
                let (tx, mut rx) = b.split();
                let (_, waker) = thread_waker();
                loop {
                    let (from, n) = block_recv(&mut rx, &waker);
                    assert_eq!(from, 0);
                    if n == rounds {
                        break;
                    }
                    tx.send(0, n + 1).unwrap();
                }
            });
            let (tx, mut rx) = a.split();
            let (_, waker) = thread_waker();
            let mut n = 0;
            while n < rounds {
                tx.send(1, n).unwrap();
                let (from, back) = block_recv(&mut rx, &waker);
                assert_eq!((from, back), (1, n + 1));
                n = back + 1;
            }
            tx.send(1, rounds).unwrap();
            pong.join().unwrap();
        });
    }

    /// Many producers flood one parked consumer; it must see every message.
    #[test]
    fn many_producers_one_parked_consumer() {
        within(120, || {
            const SHARDS: usize = 5;
            let per_producer = scaled(20_000);
            let mut ends = Mesh::<u64>::with_capacity(SHARDS, 8).into_iter();
            let consumer = ends.next().unwrap();
            let producers: Vec<_> = ends
                .map(|end| {
                    std::thread::spawn(move || {
                        for i in 0..per_producer {
                            let mut m = i;
                            while let Err(back) = end.send(0, m) {
                                m = back;
                                std::thread::yield_now();
                            }
                        }
                        end
                    })
                })
                .collect();
            let (_, mut rx) = consumer.split();
            let (_, waker) = thread_waker();
            let mut next = [0u64; SHARDS];
            for _ in 0..per_producer * (SHARDS as u64 - 1) {
                let (from, i) = block_recv(&mut rx, &waker);
                assert_eq!(i, next[from]);
                next[from] += 1;
            }
            for p in producers {
                drop(p.join().unwrap());
            }
        });
    }

    #[cfg(not(miri))]
    fn run_on(driver_uring: bool, f: impl std::future::Future<Output = ()>) {
        if driver_uring {
            let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
                .enable_timer()
                .build()
                .unwrap();
            rt.block_on(f);
        } else {
            let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .unwrap();
            rt.block_on(f);
        }
    }

    /// Two real monoio runtimes on two threads bounce a counter through the mesh with
    /// `recv().await` on both sides: the wake-ups cross threads through monoio's `sync`
    /// machinery (queued waker + driver unpark). A lost wake-up hangs and fails.
    #[cfg(not(miri))]
    fn monoio_ping_pong(uring: bool) {
        within(120, move || {
            const ROUNDS: u64 = 20_000;
            let mut ends = Mesh::<u64>::with_capacity(2, 4).into_iter();
            let (mut a, mut b) = (ends.next().unwrap(), ends.next().unwrap());
            let pong = std::thread::spawn(move || {
                run_on(uring, async move {
                    loop {
                        let (from, n) = b.recv().await;
                        assert_eq!(from, 0);
                        if n == ROUNDS {
                            break;
                        }
                        b.send(0, n + 1).unwrap();
                    }
                });
            });
            run_on(uring, async move {
                let mut n = 0;
                while n < ROUNDS {
                    a.send(1, n).unwrap();
                    let (from, back) = a.recv().await;
                    assert_eq!((from, back), (1, n + 1));
                    n = back + 1;
                }
                a.send(1, ROUNDS).unwrap();
            });
            pong.join().unwrap();
        });
    }

    #[cfg(not(miri))]
    #[test]
    fn two_monoio_runtimes_wake_each_other_legacy() {
        monoio_ping_pong(false);
    }

    #[cfg(not(miri))]
    #[test]
    fn two_monoio_runtimes_wake_each_other_io_uring() {
        if !monoio::utils::detect_uring() {
            eprintln!("io_uring unavailable here; skipping");
            return;
        }
        monoio_ping_pong(true);
    }

    /// A plain thread (no runtime) wakes a monoio runtime parked in its driver, while the
    /// runtime also runs a timer task: the mesh wake must cut the driver's sleep short.
    #[cfg(not(miri))]
    #[test]
    fn a_plain_thread_wakes_a_parked_monoio_runtime() {
        within(60, || {
            let mut ends = Mesh::<u64>::build(2).into_iter();
            let (mut rx_end, tx_end) = (ends.next().unwrap(), ends.next().unwrap());
            let producer = std::thread::spawn(move || {
                for i in 0..200 {
                    std::thread::sleep(Duration::from_millis(1));
                    tx_end.send(0, i).unwrap();
                }
                tx_end
            });
            run_on(false, async move {
                for i in 0..200 {
                    assert_eq!(rx_end.recv().await, (1, i));
                }
            });
            drop(producer.join().unwrap());
        });
    }

    #[cfg(not(miri))]
    #[test]
    fn recv_is_cancel_safe() {
        let mut ends = Mesh::<u32>::build(2).into_iter();
        let (a, mut b) = (ends.next().unwrap(), ends.next().unwrap());
        run_on(false, async move {
            // Cancel a parked recv by racing it against a timer; nothing is lost.
            monoio::select! {
                _ = b.recv() => panic!("nothing was sent"),
                _ = monoio::time::sleep(Duration::from_millis(5)) => {}
            }
            a.send(1, 42).unwrap();
            assert_eq!(b.recv().await, (0, 42));
        });
    }
}
