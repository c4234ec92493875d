//! Timers for the request path whose monoio timer entry lives on the heap.
//!
//! A `monoio::time::Sleep` is 640 bytes aligned to 128 (its two cache-padded halves), and
//! it is stored inline in whatever future awaits it: every future that may wait on one is
//! as large as the entry and 128-aligned, and so is every future around it, padding
//! included. A connection's task and each request's future (which lives as long as its
//! answer streams) carried several such slots, most of them never in use at the same
//! time. Here the entry is boxed: a wait costs 8 bytes in the future and a 640-byte
//! allocation only while the timer exists.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Completes when its duration has passed (`monoio::time::sleep`, boxed).
#[must_use = "a timer does nothing unless awaited"]
pub struct Sleep(Pin<Box<monoio::time::Sleep>>);

/// A [`Sleep`] of `d` from now.
pub fn sleep(d: Duration) -> Sleep {
    Sleep(Box::pin(monoio::time::sleep(d)))
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

/// The budget of a [`timeout`] ran out first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elapsed;

/// Runs `fut` for at most `d`. The future is pinned by the caller and held by reference
/// (taken by value, an `async fn` would store it twice: `proxy::deadline::within`); it is
/// polled before the timer, so one that is ready at once never times out — and costs no
/// timer: the entry is made (a clock read and an allocation) and registered only when the
/// first poll finds `fut` pending. The budget counts from that first poll.
pub fn timeout<F: Future>(d: Duration, fut: Pin<&mut F>) -> Timeout<'_, F> {
    Timeout {
        fut,
        budget: d,
        sleep: None,
    }
}

/// The future of [`timeout`].
#[must_use = "a timeout does nothing unless awaited"]
pub struct Timeout<'a, F> {
    fut: Pin<&'a mut F>,
    budget: Duration,
    /// Made when `fut` is first found pending.
    sleep: Option<Sleep>,
}

impl<F: Future> Future for Timeout<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(v) = self.fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        let budget = self.budget;
        let sleep = self.sleep.get_or_insert_with(|| sleep(budget));
        match Pin::new(sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// How long a [`grace`] lasts at least.
pub const GRACE_MS: u64 = 10;
/// At most how often a thread's graces are looked at while any runs: a grace ends between
/// [`GRACE_MS`] and `GRACE_MS + GRACE_TICK_MS` after its first poll.
pub const GRACE_TICK_MS: u64 = 2;

/// A wait of at least [`GRACE_MS`] that costs no timer of its own. Every grace of a thread
/// lasts the same time, so their deadlines are in the order they began: a thread keeps them
/// in one queue, and one ticking task (one timer, armed for the oldest grace's deadline but
/// at most once per [`GRACE_TICK_MS`], parked while none runs) ends the ones that are due. A grace costs a queue slot
/// instead of a timer-wheel entry (a clock read, a boxed 640-byte entry, a wheel insert and
/// remove) — what a request's client watch paid on every upstream wait, though most end
/// long before their grace does.
pub fn grace() -> Grace {
    Grace { slot: None }
}

/// The future of [`grace`]; dropping it gives its slot back.
#[must_use = "a grace does nothing unless awaited"]
pub struct Grace {
    /// (slot, generation) once registered.
    slot: Option<(u32, u32)>,
}

#[derive(Default)]
enum GraceState {
    #[default]
    Free,
    Running(std::task::Waker),
    Over,
}

#[derive(Default)]
struct GraceSlot {
    generation: u32,
    state: GraceState,
}

/// A thread's graces.
#[derive(Default)]
struct Graces {
    /// (deadline ns, slot, generation), oldest first: every grace lasts [`GRACE_MS`]. An
    /// entry whose slot moved on to another generation is skipped.
    queue: std::collections::VecDeque<(u64, u32, u32)>,
    slots: Vec<GraceSlot>,
    free: Vec<u32>,
    /// Graces registered and not over.
    running: usize,
    /// The ticking task, parked while no grace runs; `None` while it ticks.
    ticker: Option<std::task::Waker>,
    ticker_started: bool,
}

thread_local! {
    static GRACES: std::cell::RefCell<Graces> = std::cell::RefCell::new(Graces::default());
}

impl Graces {
    fn release(&mut self, slot: u32, generation: u32) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if s.generation != generation {
            return;
        }
        if matches!(s.state, GraceState::Running(_)) {
            self.running = self.running.saturating_sub(1);
        }
        s.state = GraceState::Free;
        s.generation = s.generation.wrapping_add(1);
        self.free.push(slot);
    }

    /// Ends the graces due at `now`; their wakers, to wake once the borrow is over.
    fn expire(&mut self, now: u64, woken: &mut Vec<std::task::Waker>) {
        while let Some(&(deadline, slot, generation)) = self.queue.front() {
            let live = self
                .slots
                .get(slot as usize)
                .is_some_and(|s| s.generation == generation);
            if live && deadline > now {
                break;
            }
            self.queue.pop_front();
            if let Some(s) = self.slots.get_mut(slot as usize)
                && s.generation == generation
                && let GraceState::Running(w) = std::mem::replace(&mut s.state, GraceState::Over)
            {
                self.running = self.running.saturating_sub(1);
                woken.push(w);
            }
        }
    }
}

/// The thread's ticking task: while any grace runs it sleeps until the oldest is due (at
/// least [`GRACE_TICK_MS`]) and ends the graces that are; with none running it parks (no
/// timer).
async fn grace_ticker() {
    use crate::clock::Clock as _;
    /// Dropped with the task (its runtime ended): the next grace starts a new ticker.
    struct Started;
    impl Drop for Started {
        fn drop(&mut self) {
            let _ = GRACES.try_with(|g| {
                if let Ok(mut g) = g.try_borrow_mut() {
                    g.ticker_started = false;
                    g.ticker = None;
                }
            });
        }
    }
    let _started = Started;
    let mut woken = Vec::new();
    loop {
        std::future::poll_fn(|cx| {
            GRACES.with(|g| {
                let mut g = g.borrow_mut();
                if g.running == 0 || g.queue.is_empty() {
                    g.queue.clear();
                    g.ticker = Some(cx.waker().clone());
                    Poll::Pending
                } else {
                    Poll::Ready(())
                }
            })
        })
        .await;
        // Until the oldest grace is due, and at least a tick: many graces ending close
        // together are ended by one wake-up, a lone one when it is due.
        let now = crate::clock::MonoClock.mono_ns();
        let next = GRACES.with(|g| {
            let mut g = g.borrow_mut();
            g.expire(now, &mut woken);
            g.queue.front().map(|&(deadline, _, _)| deadline)
        });
        for w in woken.drain(..) {
            w.wake();
        }
        if let Some(deadline) = next {
            let wait = deadline.saturating_sub(now).max(GRACE_TICK_MS * 1_000_000);
            monoio::time::sleep(Duration::from_nanos(wait)).await;
        }
    }
}

impl Future for Grace {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        use crate::clock::Clock as _;
        let (ready, wake_ticker, start_ticker) = GRACES.with(|g| {
            let mut g = g.borrow_mut();
            let g = &mut *g;
            match self.slot {
                None => {
                    let deadline = crate::clock::MonoClock
                        .mono_ns()
                        .saturating_add(GRACE_MS * 1_000_000);
                    let slot = match g.free.pop() {
                        Some(i) => i,
                        None => {
                            g.slots.push(GraceSlot::default());
                            u32::try_from(g.slots.len() - 1).unwrap_or(u32::MAX)
                        }
                    };
                    let Some(s) = g.slots.get_mut(slot as usize) else {
                        // Over 4 billion graces at once: no slot; end at once.
                        return (true, None, false);
                    };
                    s.state = GraceState::Running(cx.waker().clone());
                    let generation = s.generation;
                    g.queue.push_back((deadline, slot, generation));
                    g.running += 1;
                    self.slot = Some((slot, generation));
                    let start = !std::mem::replace(&mut g.ticker_started, true);
                    (false, g.ticker.take(), start)
                }
                Some((slot, generation)) => match g.slots.get_mut(slot as usize) {
                    Some(s) if s.generation == generation => match &mut s.state {
                        GraceState::Running(w) => {
                            if !w.will_wake(cx.waker()) {
                                w.clone_from(cx.waker());
                            }
                            (false, None, false)
                        }
                        GraceState::Over | GraceState::Free => (true, None, false),
                    },
                    _ => (true, None, false),
                },
            }
        });
        if let Some(w) = wake_ticker {
            w.wake();
        }
        if start_ticker {
            monoio::spawn(grace_ticker());
        }
        if ready {
            if let Some((slot, generation)) = self.slot.take() {
                GRACES.with(|g| g.borrow_mut().release(slot, generation));
            }
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Grace {
    fn drop(&mut self) {
        if let Some((slot, generation)) = self.slot.take() {
            // A thread-local already torn down (thread exit) has nothing to give back to.
            let _ = GRACES.try_with(|g| {
                if let Ok(mut g) = g.try_borrow_mut() {
                    g.release(slot, generation);
                }
            });
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Runs `f` on a one-thread legacy (epoll) runtime with timers: the unit tests of the
    /// timer-driven parts (`timer`, `net::watch`).
    pub(crate) fn run<F: Future>(f: F) -> F::Output {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime");
        rt.block_on(f)
    }

    #[test]
    fn a_ready_future_wins_and_a_pending_one_times_out() {
        run(async {
            let ready = std::pin::pin!(async { 7 });
            assert_eq!(timeout(Duration::from_millis(1), ready).await, Ok(7));
            let never = std::pin::pin!(std::future::pending::<()>());
            assert_eq!(timeout(Duration::from_millis(5), never).await, Err(Elapsed));
            let later = std::pin::pin!(sleep(Duration::from_millis(5)));
            assert_eq!(timeout(Duration::from_secs(5), later).await, Ok(()));
        });
    }

    #[test]
    fn a_timer_is_made_only_for_a_pending_future() {
        run(async {
            let ready = std::pin::pin!(async { 1 });
            let mut t = std::pin::pin!(timeout(Duration::from_secs(1), ready));
            assert_eq!(t.as_mut().await, Ok(1));
            assert!(t.sleep.is_none());
            let mut once = false;
            let later = std::pin::pin!(std::future::poll_fn(move |cx| {
                if once {
                    Poll::Ready(2)
                } else {
                    once = true;
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            }));
            let mut t = std::pin::pin!(timeout(Duration::from_secs(1), later));
            assert_eq!(t.as_mut().await, Ok(2));
            assert!(t.sleep.is_some());
        });
    }

    /// The graces of this thread that are registered and not over.
    fn graces_running() -> usize {
        GRACES.with(|g| g.borrow().running)
    }

    #[test]
    fn a_grace_lasts_its_time_and_not_much_longer() {
        use crate::clock::Clock as _;
        run(async {
            let clock = crate::clock::MonoClock;
            for _ in 0..3 {
                let start = clock.mono_ns();
                grace().await;
                let took_ms = (clock.mono_ns() - start) / 1_000_000;
                assert!(took_ms >= GRACE_MS, "ended after {took_ms} ms");
                // One tick late at most, plus a generous allowance for a loaded machine.
                assert!(
                    took_ms < GRACE_MS + GRACE_TICK_MS + 500,
                    "ended after {took_ms} ms"
                );
                assert_eq!(graces_running(), 0);
            }
        });
    }

    #[test]
    fn graces_end_in_order_and_a_dropped_one_gives_its_slot_back() {
        run(async {
            // One that a ready future beats: registered, then dropped.
            let mut early = Box::pin(grace());
            let waker = std::task::Waker::noop();
            assert!(
                early
                    .as_mut()
                    .poll(&mut Context::from_waker(waker))
                    .is_pending()
            );
            assert_eq!(graces_running(), 1);
            drop(early);
            assert_eq!(graces_running(), 0);
            // Three at once, started a little apart: all end, none early.
            let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let mut tasks = Vec::new();
            for i in 0..3 {
                let order = order.clone();
                tasks.push(monoio::spawn(async move {
                    grace().await;
                    order.borrow_mut().push(i);
                }));
                sleep(Duration::from_millis(1)).await;
            }
            for t in tasks {
                t.await;
            }
            assert_eq!(*order.borrow(), vec![0, 1, 2]);
            assert_eq!(graces_running(), 0);
            // A slot is reused: the table does not grow with the graces made.
            let slots = GRACES.with(|g| g.borrow().slots.len());
            for _ in 0..5 {
                grace().await;
            }
            assert_eq!(GRACES.with(|g| g.borrow().slots.len()), slots);
        });
    }

    #[test]
    fn the_timer_is_boxed() {
        assert!(std::mem::size_of::<Sleep>() <= 8);
        assert!(std::mem::size_of::<Option<Sleep>>() <= 8);
        assert!(std::mem::align_of::<Sleep>() <= 8);
    }
}
