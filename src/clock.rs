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

impl Clock for MonoClock {
    fn now(&self) -> Now {
        let mono_ns = u64::try_from(process_epoch().elapsed().as_nanos()).unwrap_or(u64::MAX);
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Now { mono_ns, wall_ms }
    }

    fn mono_ns(&self) -> u64 {
        u64::try_from(process_epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
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
    fn mono_clock_never_goes_backwards() {
        let c = MonoClock;
        let a = c.now();
        let b = c.now();
        assert!(b.mono_ns >= a.mono_ns);
        assert!(a.wall_ms > 1_600_000_000_000);
    }
}
