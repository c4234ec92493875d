//! The deadlines of reads without a timer per read: a client's (the keep-alive idle wait, a
//! request head's budget, a body read's idle budget) and an upstream connection's (the
//! response head's budget, a body read's idle budget). A read bounded by a `monoio` timer
//! paid, on every request of a keep-alive connection, a clock read, a boxed 640-byte timer
//! entry, a timer-wheel insert and remove, though almost every such read ends long before
//! its deadline. Here a connection holds one slot of its thread's sweep for its whole life
//! (a [`Watch`]); a read stores its deadline in the slot — a few stores — and one ticking
//! task per thread ends the reads whose deadline passed. An upstream connection keeps its
//! slot across the requests it serves from the pool (the slot holds the waker of the task
//! reading at the time).
//!
//! The sweep keeps a heap of (deadline, slot), at most one live entry per slot plus a few
//! superseded ones; a slot's entry is not moved when its connection reads again: when it
//! comes due, the sweep looks at the slot's current deadline and queues it again if it lies
//! ahead. A busy connection so costs one heap entry pushed per idle period, not per request,
//! and the sweep never walks every connection. The ticker sleeps until the earliest entry
//! is due, at least [`SWEEP_TICK_MS`] after its last round (many deadlines close together
//! are ended by one wake-up), and parks (no timer) while no entry is queued: a read ends
//! between its deadline and [`SWEEP_TICK_MS`] after it (plus the time its thread takes to
//! run the ticker).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::clock::{Clock as _, MonoClock};
use crate::timer::Elapsed;

/// At most how often a thread's sweep runs while any deadline is queued: a watched read
/// ends between its deadline and this much after it.
pub const SWEEP_TICK_MS: u64 = 10;
const TICK_NS: u64 = SWEEP_TICK_MS * 1_000_000;
/// A slot's deadline while its connection is not in a watched read; a slot's queued key
/// when it has no live heap entry.
const NONE: u64 = u64::MAX;

/// One connection's place in its thread's sweep.
struct Slot {
    /// The deadline of the watched read under way (monotonic ns), [`NONE`] between reads.
    deadline: u64,
    /// The key of this slot's live heap entry ([`NONE`]: none). Always at most `deadline`
    /// while a read is watched; entries of the slot with another key are superseded.
    queued: u64,
    /// The read under way passed its deadline.
    fired: bool,
    /// The connection's task, kept between reads (it is the same task each time).
    waker: Option<Waker>,
}

/// A thread's watched reads.
struct Sweep {
    /// (deadline ns, slot), earliest first.
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// When the ticker's next round is planned ([`NONE`]: parked).
    ticker_at: u64,
    /// The ticker, while it waits; `nudged` wakes it early (a deadline earlier than its plan).
    ticker: Option<Waker>,
    nudged: bool,
    ticker_started: bool,
}

thread_local! {
    static SWEEP: RefCell<Sweep> = const {
        RefCell::new(Sweep {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            ticker_at: NONE,
            ticker: None,
            nudged: false,
            ticker_started: false,
        })
    };
}

impl Sweep {
    /// Ends the reads due at `now` (their wakers, to wake once the borrow is over) and
    /// queues again the entries whose slot's deadline moved on; the earliest key left.
    fn expire(&mut self, now: u64, woken: &mut Vec<Waker>) -> Option<u64> {
        while let Some(&Reverse((key, slot))) = self.heap.peek() {
            if key > now {
                return Some(key);
            }
            self.heap.pop();
            let Some(s) = self.slots.get_mut(slot as usize) else {
                continue;
            };
            if s.queued != key {
                // Superseded by an earlier entry, already handled.
                continue;
            }
            s.queued = NONE;
            if s.deadline == NONE {
                // Not in a read: the next read queues it again.
            } else if s.deadline <= now {
                s.deadline = NONE;
                s.fired = true;
                if let Some(w) = &s.waker {
                    woken.push(w.clone());
                }
            } else {
                s.queued = s.deadline;
                self.heap.push(Reverse((s.deadline, slot)));
            }
        }
        None
    }

    /// Watches a read of `slot` until `deadline`. Returns the ticker's waker when it must
    /// plan again (the deadline is due well before its next round), whether the ticker
    /// must be started, and the waker this one replaced: the caller drops it once the
    /// sweep is no longer borrowed (dropping a task's last waker can drop its future, and
    /// with it a `Watch` that gives its slot back here).
    fn arm(
        &mut self,
        slot: u32,
        deadline: u64,
        waker: &Waker,
    ) -> (Option<Waker>, bool, Option<Waker>) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return (None, false, None);
        };
        s.deadline = deadline;
        s.fired = false;
        let replaced = set_waker(&mut s.waker, waker);
        let mut nudge = None;
        if deadline < s.queued {
            s.queued = deadline;
            self.heap.push(Reverse((deadline, slot)));
            if deadline.saturating_add(TICK_NS) < self.ticker_at {
                self.ticker_at = deadline;
                self.nudged = true;
                nudge = self.ticker.take();
            }
        }
        let start = !std::mem::replace(&mut self.ticker_started, true);
        (nudge, start, replaced)
    }

    fn take_slot(&mut self) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            return Some(i);
        }
        let i = u32::try_from(self.slots.len()).ok()?;
        self.slots.push(Slot {
            deadline: NONE,
            queued: NONE,
            fired: false,
            waker: None,
        });
        Some(i)
    }
}

/// A connection's read watch: one slot of its thread's sweep, taken at the first read it
/// bounds and given back when dropped. 8 bytes in the connection's task.
#[derive(Default)]
pub struct Watch {
    slot: Option<u32>,
}

impl Watch {
    /// Runs `read` until `deadline_ns` (monotonic ns, [`crate::clock::Clock::mono_ns`]):
    /// `Err(Elapsed)` when the deadline passed first (seen within [`SWEEP_TICK_MS`]). The
    /// read is polled first; one ready at once is not watched. The read is pinned by the
    /// caller and held by reference.
    pub fn within<'a, F: Future>(
        &'a mut self,
        deadline_ns: u64,
        read: Pin<&'a mut F>,
    ) -> Within<'a, F> {
        Within {
            read,
            watch: self,
            deadline: deadline_ns,
            relative: false,
            armed: false,
        }
    }

    /// Runs `read` for at most `budget`, counted from the poll that first finds it pending
    /// (a `timer::timeout`'s budget, without its timer): `Err(Elapsed)` when the budget
    /// ran out first (seen within [`SWEEP_TICK_MS`]). A read ready at its first poll is not
    /// watched and reads no clock; one found pending reads the clock once
    /// ([`MonoClock::mono_ns`]: the reading of the poll under way inside a
    /// [`crate::clock::OneReading`]).
    pub fn within_for<'a, F: Future>(
        &'a mut self,
        budget: Duration,
        read: Pin<&'a mut F>,
    ) -> Within<'a, F> {
        Within {
            read,
            watch: self,
            deadline: u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX),
            relative: true,
            armed: false,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        // A thread-local already torn down (thread exit) has nothing to give back to. The
        // slot's waker is dropped after the borrow ends (see `Sweep::arm`).
        let _waker = SWEEP.try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            let waker = s.slots.get_mut(slot as usize).and_then(|x| {
                // Its heap entry (if any) stays: whoever takes the slot next finds it,
                // so a closed connection's entry does not outlive the slot.
                x.deadline = NONE;
                x.fired = false;
                x.waker.take()
            });
            s.free.push(slot);
            waker
        });
    }
}

/// Makes `slot` hold `waker` (kept as it is when it already wakes the same task); returns the
/// waker it held before, for the caller to drop outside the sweep's borrow.
fn set_waker(slot: &mut Option<Waker>, waker: &Waker) -> Option<Waker> {
    match slot {
        Some(w) if w.will_wake(waker) => None,
        _ => slot.replace(waker.clone()),
    }
}

/// The future of [`Watch::within`].
#[must_use = "a watched read does nothing unless awaited"]
pub struct Within<'a, F> {
    read: Pin<&'a mut F>,
    watch: &'a mut Watch,
    /// Monotonic ns; with `relative`, the budget to add to the clock when first armed.
    deadline: u64,
    relative: bool,
    /// The slot holds this read's deadline.
    armed: bool,
}

impl<F: Future> Future for Within<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(v) = self.read.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        let this = &mut *self;
        // The waker a slot held before this read's is dropped after the sweep's borrow
        // ends (see `Sweep::arm`).
        let (fired, nudge, start, _replaced) = SWEEP.with(|s| {
            let mut s = s.borrow_mut();
            let slot = match this.watch.slot {
                Some(i) => i,
                None => {
                    let Some(i) = s.take_slot() else {
                        // Over 4 billion connections on one thread: unwatched.
                        return (false, None, false, None);
                    };
                    this.watch.slot = Some(i);
                    i
                }
            };
            if this.armed {
                let Some(x) = s.slots.get_mut(slot as usize) else {
                    return (false, None, false, None);
                };
                if x.fired {
                    return (true, None, false, None);
                }
                (false, None, false, set_waker(&mut x.waker, cx.waker()))
            } else {
                this.armed = true;
                if std::mem::take(&mut this.relative) {
                    this.deadline = MonoClock.mono_ns().saturating_add(this.deadline);
                }
                let (nudge, start, replaced) = s.arm(slot, this.deadline, cx.waker());
                (false, nudge, start, replaced)
            }
        });
        if let Some(w) = nudge {
            w.wake();
        }
        if start {
            monoio::spawn(ticker());
        }
        if fired {
            return Poll::Ready(Err(Elapsed));
        }
        Poll::Pending
    }
}

impl<F> Drop for Within<'_, F> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Some(slot) = self.watch.slot else {
            return;
        };
        let _ = SWEEP.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut()
                && let Some(x) = s.slots.get_mut(slot as usize)
            {
                // Between reads: its heap entry, when it comes due, is dropped.
                x.deadline = NONE;
                x.fired = false;
            }
        });
    }
}

/// The thread's ticking task: a round ends the due reads, then it sleeps until the
/// earliest queued deadline (at least [`SWEEP_TICK_MS`]), or until a read armed with an
/// earlier one nudges it; with nothing queued it parks (no timer).
async fn ticker() {
    /// Dropped with the task (its runtime ended): the next watched read starts a new one.
    struct Started;
    impl Drop for Started {
        fn drop(&mut self) {
            let _ = SWEEP.try_with(|s| {
                if let Ok(mut s) = s.try_borrow_mut() {
                    s.ticker_started = false;
                    s.ticker = None;
                    s.ticker_at = NONE;
                    s.nudged = false;
                }
            });
        }
    }
    let _started = Started;
    let mut woken = Vec::new();
    loop {
        let now = MonoClock.mono_ns();
        let next = SWEEP.with(|s| {
            let mut s = s.borrow_mut();
            let next = s.expire(now, &mut woken);
            s.ticker_at = next.map_or(NONE, |k| k.max(now.saturating_add(TICK_NS)));
            s.nudged = false;
            s.ticker_at
        });
        for w in woken.drain(..) {
            w.wake();
        }
        let nudge = std::future::poll_fn(|cx| {
            SWEEP.with(|s| {
                let mut s = s.borrow_mut();
                if std::mem::take(&mut s.nudged) {
                    Poll::Ready(())
                } else {
                    s.ticker = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
        });
        if next == NONE {
            nudge.await;
        } else {
            let sleep = monoio::time::sleep(Duration::from_nanos(next - now));
            monoio::select! {
                () = sleep => {}
                () = nudge => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timer::tests::run;

    fn now() -> u64 {
        MonoClock.mono_ns()
    }

    fn queued() -> usize {
        SWEEP.with(|s| s.borrow().heap.len())
    }

    #[test]
    fn a_ready_read_wins_and_a_pending_one_ends_at_its_deadline() {
        run(async {
            let mut watch = Watch::default();
            let ready = std::pin::pin!(async { 7 });
            assert_eq!(watch.within(now(), ready).await, Ok(7));
            assert!(watch.slot.is_none(), "a ready read takes no slot");
            for budget_ms in [30, 5, 50] {
                let start = now();
                let never = std::pin::pin!(std::future::pending::<()>());
                let deadline = start + budget_ms * 1_000_000;
                assert_eq!(watch.within(deadline, never).await, Err(Elapsed));
                let took_ms = (now() - start) / 1_000_000;
                assert!(took_ms >= budget_ms, "ended after {took_ms} ms");
                // A tick late at most, plus an allowance for a loaded machine.
                assert!(
                    took_ms < budget_ms + SWEEP_TICK_MS + 500,
                    "ended after {took_ms} ms"
                );
            }
            let later = std::pin::pin!(monoio::time::sleep(Duration::from_millis(5)));
            assert_eq!(watch.within(now() + 5_000_000_000, later).await, Ok(()));
        });
    }

    #[test]
    fn reads_that_end_in_time_do_not_fire_or_queue_per_read() {
        run(async {
            let mut watch = Watch::default();
            let before = queued();
            for _ in 0..50 {
                let read = std::pin::pin!(monoio::time::sleep(Duration::from_micros(100)));
                assert_eq!(watch.within(now() + 60_000_000_000, read).await, Ok(()));
            }
            // One entry for the connection, however many reads it made.
            assert_eq!(queued(), before + 1);
            // A shorter deadline (a head's budget) is queued beside it, and fires.
            let never = std::pin::pin!(std::future::pending::<()>());
            assert_eq!(watch.within(now() + 20_000_000, never).await, Err(Elapsed));
            // The next read is not already over.
            let read = std::pin::pin!(monoio::time::sleep(Duration::from_millis(30)));
            assert_eq!(watch.within(now() + 1_000_000_000, read).await, Ok(()));
        });
    }

    #[test]
    fn many_connections_end_in_deadline_order_and_slots_are_reused() {
        run(async {
            let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let start = now();
            let mut tasks = Vec::new();
            // Armed in reverse order of their deadlines: the later-armed earlier ones nudge
            // the ticker.
            for i in (0..4u64).rev() {
                let order = order.clone();
                tasks.push(monoio::spawn(async move {
                    let mut watch = Watch::default();
                    let never = std::pin::pin!(std::future::pending::<()>());
                    let deadline = start + (20 + 40 * i) * 1_000_000;
                    assert_eq!(watch.within(deadline, never).await, Err(Elapsed));
                    assert!(now() >= deadline);
                    order.borrow_mut().push(i);
                }));
            }
            for t in tasks {
                t.await;
            }
            assert_eq!(*order.borrow(), vec![0, 1, 2, 3]);
            let slots = SWEEP.with(|s| s.borrow().slots.len());
            for _ in 0..5 {
                let mut watch = Watch::default();
                let never = std::pin::pin!(std::future::pending::<()>());
                assert_eq!(watch.within(now() + 1_000_000, never).await, Err(Elapsed));
            }
            assert_eq!(SWEEP.with(|s| s.borrow().slots.len()), slots);
        });
    }

    #[test]
    fn a_budget_ends_like_a_timeout_counted_from_the_first_pending_poll() {
        let ms = Duration::from_millis;
        run(async {
            let mut watch = Watch::default();
            let ready = std::pin::pin!(async { 3 });
            assert_eq!(watch.within_for(Duration::ZERO, ready).await, Ok(3));
            assert!(watch.slot.is_none(), "a ready read takes no slot");
            // The outcome of `timer::timeout` wherever the read ends clear of the budget
            // (by more than a tick and a loaded machine's allowance).
            for (read_ms, budget_ms) in [(1, 300), (300, 1), (0, 40), (40, 600), (600, 40)] {
                let watched = {
                    let read = std::pin::pin!(monoio::time::sleep(ms(read_ms)));
                    watch.within_for(ms(budget_ms), read).await
                };
                let timed = {
                    let read = std::pin::pin!(monoio::time::sleep(ms(read_ms)));
                    crate::timer::timeout(ms(budget_ms), read).await
                };
                assert_eq!(watched, timed, "read {read_ms} ms, budget {budget_ms} ms");
            }
            // Reads that end in time queue nothing each: the first queues the connection's
            // entry, the others find it there (entries left by the reads above only leave).
            let read = std::pin::pin!(monoio::time::sleep(Duration::from_micros(100)));
            assert_eq!(watch.within_for(ms(60_000), read).await, Ok(()));
            let before = queued();
            for _ in 0..50 {
                let read = std::pin::pin!(monoio::time::sleep(Duration::from_micros(100)));
                assert_eq!(watch.within_for(ms(60_000), read).await, Ok(()));
            }
            assert!(queued() <= before, "{} entries, {before} before", queued());
            // Made well before its first poll: the budget counts from that poll.
            let never = std::pin::pin!(std::future::pending::<()>());
            let wait = watch.within_for(ms(30), never);
            monoio::time::sleep(ms(60)).await;
            let polled = now();
            assert_eq!(wait.await, Err(Elapsed));
            let took_ms = (now() - polled) / 1_000_000;
            assert!(took_ms >= 30, "ended after {took_ms} ms");
            assert!(
                took_ms < 30 + SWEEP_TICK_MS + 500,
                "ended after {took_ms} ms"
            );
        });
    }

    #[test]
    fn the_watch_is_small() {
        assert!(std::mem::size_of::<Watch>() <= 8);
    }
}
