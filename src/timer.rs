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
/// polled before the timer, so one that is ready at once never times out.
///
/// The timer is made when `fut` first answers `Pending`, not before: a wait that is over at
/// its first poll (an admission granted at once, a body already buffered) costs no timer
/// entry, no clock reading and no allocation. Every caller awaits the timeout where it
/// makes it, so the budget still runs from the start of the wait (its first poll).
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
    /// Made at the first `Pending` of `fut`.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: Future>(f: F) -> F::Output {
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
    fn a_wait_ready_at_once_makes_no_timer_and_a_pending_one_does() {
        run(async {
            let mut ready = std::pin::pin!(async { 7 });
            let mut t = std::pin::pin!(timeout(Duration::from_secs(5), ready.as_mut()));
            assert_eq!(t.as_mut().await, Ok(7));
            assert!(t.sleep.is_none());
            let mut never = std::pin::pin!(std::future::pending::<()>());
            let mut t = std::pin::pin!(timeout(Duration::from_millis(1), never.as_mut()));
            let polled = std::future::poll_fn(|cx| Poll::Ready(t.as_mut().poll(cx).is_pending()));
            assert!(polled.await);
            assert!(t.sleep.is_some());
            assert_eq!(t.as_mut().await, Err(Elapsed));
        });
    }

    #[test]
    fn the_timer_is_boxed() {
        assert!(std::mem::size_of::<Sleep>() <= 8);
        assert!(std::mem::align_of::<Sleep>() <= 8);
    }
}
