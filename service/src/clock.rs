//! Time, injected: a service that decides by time (leases, heartbeats,
//! timeouts, retries) reads it from a [`Clock`] it is given, so that a test
//! can run the same code on a [`ManualClock`] whose time moves only when the
//! test says, and replay a run exactly.
//!
//! [`SystemClock`] is the real time (std's monotonic clock, tokio's timers);
//! it is the one place that reads it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

/// What [`Clock::sleep`] returns: completes once the clock has advanced by
/// the duration asked. Dropping it cancels the wait.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Where time comes from.
pub trait Clock: Send + Sync + 'static {
    /// The monotonic time: decisions compare these, never wall-clock times.
    fn now(&self) -> Instant;

    /// The wall-clock time, for what people read (logs, timestamps).
    fn system_now(&self) -> SystemTime;

    /// Waits until [`Clock::now`] has advanced by `duration`.
    fn sleep(&self, duration: Duration) -> Sleep;

    /// Blocks the calling thread until [`Clock::now`] has advanced by
    /// `duration`: for threads of a service's own, outside any runtime.
    fn sleep_blocking(&self, duration: Duration) {
        block_on(self.sleep(duration));
    }

    /// How long ago `earlier` was (zero if it is not in the past).
    fn since(&self, earlier: Instant) -> Duration {
        self.now().saturating_duration_since(earlier)
    }
}

/// Polls `future` on this thread, parked between wake-ups: a
/// [`ManualClock`]'s sleeps need no runtime, and this may be called from
/// any thread (an async test's too), unlike a runtime's `block_on`.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Wakes a thread parked in [`block_on`].
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A wait that ran out (from [`timeout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("timed out")]
pub struct Elapsed;

/// Runs `future` for at most `limit` of `clock`'s time.
pub async fn timeout<F: Future>(clock: &dyn Clock, limit: Duration, future: F) -> Result<F::Output, Elapsed> {
    let mut future = std::pin::pin!(future);
    let mut sleep = clock.sleep(limit);
    std::future::poll_fn(|cx| {
        // The future first: one that is ready at the deadline has not timed out.
        if let Poll::Ready(v) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        sleep.as_mut().poll(cx).map(|()| Err(Elapsed))
    })
    .await
}

/// The reads of the real time; nothing else in a converted crate reads it
/// (the `disallowed-methods` lint of their `clippy.toml`).
#[allow(clippy::disallowed_methods)]
mod real {
    pub(super) fn instant() -> std::time::Instant {
        std::time::Instant::now()
    }

    pub(super) fn system() -> std::time::SystemTime {
        std::time::SystemTime::now()
    }

    pub(super) fn sleep(duration: std::time::Duration) {
        std::thread::sleep(duration);
    }
}

/// The real time: std's clocks, and tokio's timers for sleeping (so
/// [`Clock::sleep`] needs a tokio runtime with time enabled).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        real::instant()
    }

    fn system_now(&self) -> SystemTime {
        real::system()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }

    fn sleep_blocking(&self, duration: Duration) {
        real::sleep(duration);
    }
}

/// A clock whose time moves only when [`ManualClock::advance`] or
/// [`ManualClock::advance_to`] is called; sleeps complete then, in the order
/// of their deadlines. Clones share one time. Any executor can poll its
/// sleeps (they need no runtime).
#[derive(Clone)]
pub struct ManualClock {
    timers: Arc<Mutex<Timers>>,
}

/// The time of a [`ManualClock`] and the sleeps waiting on it.
struct Timers {
    /// What `now()` returns at elapsed zero.
    origin: Instant,
    /// Time since the origin.
    elapsed: Duration,
    /// Waiting sleeps by (deadline since the origin, creation order): ties
    /// are woken in the order they were made.
    waiting: BTreeMap<(Duration, u64), Option<Waker>>,
    next_id: u64,
}

/// The wall-clock time of a manual clock at elapsed zero: fixed, so that a
/// replayed run sees the same timestamps (2023-11-14T22:13:20Z).
const MANUAL_SYSTEM_ORIGIN: Duration = Duration::from_secs(1_700_000_000);

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl ManualClock {
    /// A clock at elapsed zero. Its instants are built on one read of the
    /// real monotonic clock (an `Instant` cannot be made otherwise); only
    /// differences between them mean anything, and those are exact.
    pub fn new() -> ManualClock {
        ManualClock {
            timers: Arc::new(Mutex::new(Timers {
                origin: real::instant(),
                elapsed: Duration::ZERO,
                waiting: BTreeMap::new(),
                next_id: 0,
            })),
        }
    }

    /// Time since the clock was made.
    pub fn elapsed(&self) -> Duration {
        self.timers.lock().elapsed
    }

    /// Moves time forward by `by`, completing the sleeps that come due.
    pub fn advance(&self, by: Duration) {
        let to = self.elapsed() + by;
        self.set_elapsed(to);
    }

    /// Moves time forward to `to` (never back: an earlier `to` changes nothing).
    pub fn advance_to(&self, to: Instant) {
        let origin = self.timers.lock().origin;
        self.set_elapsed(to.saturating_duration_since(origin));
    }

    fn set_elapsed(&self, to: Duration) {
        let due: Vec<Waker> = {
            let mut t = self.timers.lock();
            if to <= t.elapsed {
                return;
            }
            t.elapsed = to;
            let later = t.waiting.split_off(&(to, u64::MAX));
            let due = std::mem::replace(&mut t.waiting, later);
            due.into_values().flatten().collect()
        };
        // Woken outside the lock: a waker may poll at once.
        for w in due {
            w.wake();
        }
    }

    /// The earliest deadline of a sleep still waiting.
    pub fn next_deadline(&self) -> Option<Instant> {
        let t = self.timers.lock();
        t.waiting.keys().next().map(|(at, _)| t.origin + *at)
    }

    /// How many sleeps are waiting.
    pub fn sleeping(&self) -> usize {
        self.timers.lock().waiting.len()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        let t = self.timers.lock();
        t.origin + t.elapsed
    }

    fn system_now(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + MANUAL_SYSTEM_ORIGIN + self.elapsed()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        let mut t = self.timers.lock();
        let deadline = t.elapsed.saturating_add(duration);
        let id = t.next_id;
        t.next_id += 1;
        if deadline > t.elapsed {
            t.waiting.insert((deadline, id), None);
        }
        Box::pin(ManualSleep { timers: self.timers.clone(), key: (deadline, id) })
    }
}

/// A sleep on a [`ManualClock`].
struct ManualSleep {
    timers: Arc<Mutex<Timers>>,
    key: (Duration, u64),
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut t = self.timers.lock();
        if t.elapsed >= self.key.0 {
            t.waiting.remove(&self.key);
            return Poll::Ready(());
        }
        t.waiting.insert(self.key, Some(cx.waker().clone()));
        Poll::Pending
    }
}

impl Drop for ManualSleep {
    fn drop(&mut self) {
        self.timers.lock().waiting.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn a_manual_clock_moves_only_when_advanced_and_wakes_sleeps_in_deadline_order() {
        let clock = ManualClock::new();
        let start = clock.now();
        let mut long = clock.sleep(Duration::from_secs(2));
        let mut short = clock.sleep(Duration::from_secs(1));
        assert!(poll_once(long.as_mut()).is_pending() && poll_once(short.as_mut()).is_pending());
        assert_eq!(clock.next_deadline(), Some(start + Duration::from_secs(1)));
        assert_eq!(clock.now(), start, "time stands still");
        clock.advance(Duration::from_millis(1500));
        assert!(poll_once(short.as_mut()).is_ready() && poll_once(long.as_mut()).is_pending());
        assert_eq!(clock.since(start), Duration::from_millis(1500));
        clock.advance_to(start + Duration::from_secs(2));
        assert!(poll_once(long.as_mut()).is_ready());
        assert_eq!(clock.sleeping(), 0);
        // Backwards is ignored; a dropped sleep stops waiting.
        clock.advance_to(start);
        assert_eq!(clock.elapsed(), Duration::from_secs(2));
        let dropped = clock.sleep(Duration::from_secs(1));
        assert_eq!(clock.sleeping(), 1);
        drop(dropped);
        assert_eq!((clock.sleeping(), clock.next_deadline()), (0, None));
        assert!(poll_once(clock.sleep(Duration::ZERO).as_mut()).is_ready());
        assert_eq!(
            clock.system_now(),
            SystemTime::UNIX_EPOCH + MANUAL_SYSTEM_ORIGIN + Duration::from_secs(2),
            "wall-clock time is fixed too"
        );
    }

    #[test]
    fn a_timeout_runs_out_on_the_clock_it_is_given() {
        let clock = ManualClock::new();
        let never = std::future::pending::<()>();
        let mut waiting = Box::pin(timeout(&clock, Duration::from_secs(1), never));
        assert!(poll_once(waiting.as_mut()).is_pending());
        clock.advance(Duration::from_millis(999));
        assert!(poll_once(waiting.as_mut()).is_pending());
        clock.advance(Duration::from_millis(1));
        assert_eq!(poll_once(waiting.as_mut()), Poll::Ready(Err(Elapsed)));
        let mut ready = Box::pin(timeout(&clock, Duration::ZERO, async { 7 }));
        assert_eq!(poll_once(ready.as_mut()), Poll::Ready(Ok(7)));
    }

    #[test]
    fn a_blocking_sleep_on_a_manual_clock_ends_when_the_clock_passes_it() {
        let clock = ManualClock::new();
        let sleeper = {
            let clock = clock.clone();
            std::thread::spawn(move || clock.sleep_blocking(Duration::from_secs(3600)))
        };
        while clock.sleeping() == 0 {
            std::thread::yield_now();
        }
        clock.advance(Duration::from_secs(3599));
        assert_eq!(clock.sleeping(), 1, "not due yet");
        clock.advance(Duration::from_secs(1));
        sleeper.join().expect("the sleeper ends");
        assert_eq!(clock.sleeping(), 0);
        let start = SystemClock.now();
        SystemClock.sleep_blocking(Duration::from_millis(5));
        assert!(SystemClock.since(start) >= Duration::from_millis(5), "outside any runtime too");
    }

    #[tokio::test]
    async fn the_system_clock_sleeps_in_real_time() {
        let clock = SystemClock;
        let start = clock.now();
        clock.sleep(Duration::from_millis(20)).await;
        assert!(clock.since(start) >= Duration::from_millis(20));
        assert_eq!(timeout(&clock, Duration::from_millis(10), std::future::pending::<()>()).await, Err(Elapsed));
        assert!(clock.system_now() > SystemTime::UNIX_EPOCH + MANUAL_SYSTEM_ORIGIN);
    }
}
