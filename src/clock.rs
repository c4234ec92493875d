//! The only place that reads time. Every state machine takes `now` as an argument; the
//! runtime reads a [`Clock`] once per event and passes the value down, and tests step a
//! `ManualClock` (unit tests) instead of sleeping.
#![allow(clippy::disallowed_methods)]

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A point in time as both clocks see it: monotonic nanoseconds for deadlines that never
/// leave the process, wall-clock milliseconds for anything persisted or shown to people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Now {
    /// Monotonic nanoseconds since the process epoch (first clock read).
    pub mono_ns: u64,
    /// Milliseconds since the Unix epoch.
    pub wall_ms: u64,
}

impl Now {
    /// Monotonic milliseconds since the process epoch.
    pub fn mono_ms(self) -> u64 {
        self.mono_ns / 1_000_000
    }
}

/// Source of time for the runtime and for tests.
pub trait Clock {
    fn now(&self) -> Now;

    /// Monotonic nanoseconds only (one clock read where the wall clock is not needed).
    fn mono_ns(&self) -> u64 {
        self.now().mono_ns
    }
}

fn process_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The real clock: `Instant` for monotonic time, `SystemTime` for wall-clock time.
#[derive(Clone, Copy, Debug, Default)]
pub struct MonoClock;

/// How long a wall-clock reading is extended by the monotonic clock before the wall clock
/// is read again. A request reads the time many times within a few microseconds; reading
/// both clocks each time cost two clock reads per `now()`. Within this window the wall
/// time is the last reading plus the monotonic time since (the two clocks run at the same
/// rate to within NTP's slew), so `wall_ms` is exact to the millisecond and a step of the
/// wall clock is seen within 1 ms.
const WALL_REREAD_NS: u64 = 1_000_000;
/// Most monotonic time between the two readings of a pair that is kept.
const WALL_PAIR_SLACK_NS: u64 = 20_000;

fn mono_now() -> u64 {
    u64::try_from(process_epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

thread_local! {
    /// This thread's last wall-clock reading: (monotonic ns when taken, wall ns).
    static WALL: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((u64::MAX, 0)) };
}

fn wall_ms_at(mono_ns: u64) -> u64 {
    WALL.with(|last| {
        let (at, wall_ns) = last.get();
        if let Some(since) = mono_ns.checked_sub(at)
            && since < WALL_REREAD_NS
        {
            return wall_ns.saturating_add(since) / 1_000_000;
        }
        let wall_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        // Kept only when the two readings are close (the thread was not preempted between
        // them), so the pair is off by at most half that gap.
        let after = mono_now();
        if after.saturating_sub(mono_ns) <= WALL_PAIR_SLACK_NS {
            last.set((mono_ns + after.saturating_sub(mono_ns) / 2, wall_ns));
        }
        wall_ns / 1_000_000
    })
}

/// This thread's reading for the poll under way (see [`OneReading`]).
#[derive(Clone, Copy)]
enum PollReading {
    /// No [`OneReading`] poll is running: every `now()` reads the clocks.
    Off,
    /// A poll is running and has not read the time yet.
    Unread,
    /// A poll is running and read this.
    Read(Now),
}

thread_local! {
    static POLL: std::cell::Cell<PollReading> = const { std::cell::Cell::new(PollReading::Off) };
}

fn read_now() -> Now {
    let mono_ns = mono_now();
    Now {
        mono_ns,
        wall_ms: wall_ms_at(mono_ns),
    }
}

impl MonoClock {
    /// Monotonic nanoseconds read at this moment, even inside a [`OneReading`] poll: for
    /// a span that may begin and end within one poll (an answer made in-process), which
    /// the poll's one reading would show as zero.
    pub fn exact_mono_ns() -> u64 {
        mono_now()
    }
}

impl Clock for MonoClock {
    fn now(&self) -> Now {
        POLL.with(|poll| match poll.get() {
            PollReading::Off => read_now(),
            PollReading::Unread => {
                let now = read_now();
                poll.set(PollReading::Read(now));
                now
            }
            PollReading::Read(now) => now,
        })
    }

    fn mono_ns(&self) -> u64 {
        POLL.with(|poll| match poll.get() {
            PollReading::Off => mono_now(),
            PollReading::Unread => {
                let now = read_now();
                poll.set(PollReading::Read(now));
                now.mono_ns
            }
            PollReading::Read(now) => now.mono_ns,
        })
    }
}

/// Runs a future so that one poll of it reads the clock at most once: every
/// [`MonoClock::now`] within the same poll (the synchronous stretch between two of its
/// awaits, microseconds long) returns that poll's first reading. A request asked for the
/// time ~17 times per answer, most of them within a few microseconds of each other; each
/// was a `clock_gettime`. Time still moves between polls, which is where a request waits.
/// Readings outside such a poll (other tasks, timers) are not affected; nested wrappers
/// keep the outer poll's reading.
#[derive(Debug)]
pub struct OneReading<F>(pub F);

impl<F: std::future::Future + Unpin> std::future::Future for OneReading<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let outer = POLL.with(|poll| {
            let outer = poll.get();
            if matches!(outer, PollReading::Off) {
                poll.set(PollReading::Unread);
            }
            outer
        });
        // Restored even if the inner poll unwinds, so no stale reading outlives the poll.
        struct Restore(PollReading);
        impl Drop for Restore {
            fn drop(&mut self) {
                let outer = self.0;
                POLL.with(|poll| {
                    if matches!(outer, PollReading::Off) {
                        poll.set(PollReading::Off);
                    }
                });
            }
        }
        let _restore = Restore(outer);
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

/// A clock that only moves when told to, for unit tests. Cloning shares the same time.
#[cfg(test)]
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: std::rc::Rc<std::cell::Cell<Now>>,
}

#[cfg(test)]
impl ManualClock {
    pub fn new(wall_ms: u64) -> Self {
        Self {
            now: std::rc::Rc::new(std::cell::Cell::new(Now {
                mono_ns: 0,
                wall_ms,
            })),
        }
    }

    pub fn advance_ms(&self, ms: u64) {
        self.advance(std::time::Duration::from_millis(ms));
    }

    pub fn advance(&self, by: std::time::Duration) {
        let mut n = self.now.get();
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        n.mono_ns = n.mono_ns.saturating_add(ns);
        n.wall_ms = n.wall_ms.saturating_add(ns / 1_000_000);
        self.now.set(n);
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Now {
        self.now.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        let shared = c.clone();
        assert_eq!(
            c.now(),
            Now {
                mono_ns: 0,
                wall_ms: 1_000
            }
        );
        shared.advance_ms(250);
        assert_eq!(c.now().mono_ms(), 250);
        assert_eq!(c.now().wall_ms, 1_250);
    }

    #[test]
    fn mono_clock_wall_time_matches_the_system_clock() {
        let c = MonoClock;
        for _ in 0..1000 {
            let before = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap();
            let now = c.now();
            let after = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap();
            // Extended readings are off by at most the pair's slack: one ms either side.
            assert!(
                before <= now.wall_ms + 1 && now.wall_ms <= after + 1,
                "{before} {now:?} {after}"
            );
        }
    }

    #[test]
    fn one_poll_reads_the_clock_once_and_the_next_poll_reads_again() {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};

        let c = MonoClock;
        let mut polls = 0;
        let seen = std::cell::RefCell::new(Vec::new());
        let mut f = OneReading(std::future::poll_fn(|cx| {
            let a = c.now();
            std::thread::sleep(std::time::Duration::from_millis(2));
            // The same reading, monotonic and wall, for the rest of this poll.
            assert_eq!(c.now(), a);
            assert_eq!(c.mono_ns(), a.mono_ns);
            seen.borrow_mut().push(a);
            polls += 1;
            if polls < 2 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(std::pin::Pin::new(&mut f).poll(&mut cx).is_pending());
        // Outside the poll the clock is read afresh.
        let between = c.now();
        assert!(between.mono_ns >= seen.borrow()[0].mono_ns + 2_000_000);
        assert!(std::pin::Pin::new(&mut f).poll(&mut cx).is_ready());
        let second = seen.borrow()[1];
        assert!(second.mono_ns >= between.mono_ns);
        let after = c.now();
        assert!(after.mono_ns > second.mono_ns);
    }

    #[test]
    fn mono_clock_never_goes_backwards() {
        let c = MonoClock;
        let a = c.now();
        let b = c.now();
        assert!(b.mono_ns >= a.mono_ns);
        assert!(a.wall_ms > 1_600_000_000_000);
    }
}
