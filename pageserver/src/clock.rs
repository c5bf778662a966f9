//! The pageserver's time: every component reads it from the
//! [`Clock`] of its [`TimelineResources`](crate::timeline::TimelineResources)
//! (the real one in a running pageserver, a `ManualClock` in tests). The
//! pageserver's own threads (WAL receivers, flushers, the compactor) wait on
//! it here, outside any runtime (`Clock::sleep_blocking`).

use std::sync::Arc;
use std::time::Duration;

pub use strata_service::clock::{timeout, Clock, Elapsed, ManualClock, SystemClock};

/// The real clock, as every component's shared handle.
pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// Now on `clock`, as PostgreSQL stamps commits (what GC's `pitr_interval`
/// and branches by time compare with).
pub fn pg_now(clock: &dyn Clock) -> i64 {
    strata_formats::time::from_system_time(clock.system_now())
}

/// Blocks the calling thread until `clock` has advanced by `duration`.
/// For a thread of the pageserver's own, not a runtime's worker.
pub fn sleep_blocking(clock: &dyn Clock, duration: Duration) {
    clock.sleep_blocking(duration);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_thread_wakes_when_the_manual_clock_passes_its_deadline() {
        let clock = ManualClock::new();
        let sleeper = {
            let clock = clock.clone();
            std::thread::spawn(move || sleep_blocking(&clock, Duration::from_secs(3600)))
        };
        // The sleep is registered once the thread polled it.
        while clock.sleeping() == 0 {
            std::thread::yield_now();
        }
        clock.advance(Duration::from_secs(3599));
        // Not yet due: still waiting (a sleep leaves the table when it ends).
        assert_eq!(clock.sleeping(), 1);
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(1));
        sleeper.join().expect("the sleeper finishes");
        assert_eq!(clock.sleeping(), 0);
    }

    #[test]
    fn the_real_clock_sleeps_outside_any_runtime() {
        let clock = SystemClock;
        let start = clock.now();
        sleep_blocking(&clock, Duration::from_millis(5));
        assert!(clock.since(start) >= Duration::from_millis(5));
    }
}
