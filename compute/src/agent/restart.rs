//! When to restart something that failed: exponential backoff with jitter,
//! reset after a long enough run, and crash-loop detection. Pure policy:
//! the caller passes the clock and the jitter in, so the arithmetic is
//! tested deterministically. The compute agent uses it for PostgreSQL, the
//! local cluster's supervisor for whole services.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How restarts are paced, and how many make a crash loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Delay before the first restart after a good run; jitter adds up to as much again.
    pub first_delay: Duration,
    /// Upper bound of every delay.
    pub max_delay: Duration,
    /// A run at least this long resets the backoff to `first_delay`.
    pub reset_after: Duration,
    /// This many restarts within `crash_loop_window` are a crash loop.
    pub crash_loop_restarts: u32,
    pub crash_loop_window: Duration,
}

impl Default for RestartPolicy {
    fn default() -> RestartPolicy {
        RestartPolicy {
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(30),
            reset_after: Duration::from_secs(60),
            crash_loop_restarts: 5,
            crash_loop_window: Duration::from_secs(300),
        }
    }
}

impl RestartPolicy {
    /// Checks that the numbers make sense (nonzero, ordered).
    pub fn validate(&self) -> Result<(), String> {
        if self.first_delay.is_zero() {
            return Err("the first restart delay must be positive".into());
        }
        if self.max_delay < self.first_delay {
            return Err(format!(
                "the longest restart delay ({:?}) is shorter than the first ({:?})",
                self.max_delay, self.first_delay
            ));
        }
        if self.crash_loop_restarts == 0 {
            return Err("a crash loop needs at least one restart".into());
        }
        if self.crash_loop_window.is_zero() {
            return Err("the crash-loop window must be positive".into());
        }
        Ok(())
    }
}

/// The restart history of one thing: consecutive failures (for the
/// backoff) and the times of recent restarts (for crash loops). Its memory
/// is bounded by `crash_loop_restarts`.
#[derive(Clone, Debug)]
pub struct RestartTracker {
    policy: RestartPolicy,
    /// Failures since the last run that lasted `reset_after`.
    consecutive: u32,
    /// The latest restarts, oldest first; at most `crash_loop_restarts`.
    recent: VecDeque<Instant>,
    total: u64,
}

impl RestartTracker {
    pub fn new(policy: RestartPolicy) -> RestartTracker {
        RestartTracker { policy, consecutive: 0, recent: VecDeque::new(), total: 0 }
    }

    pub fn policy(&self) -> &RestartPolicy {
        &self.policy
    }

    /// A run ended after `uptime` (zero for an attempt that never came up).
    /// Returns how long to wait before the next attempt: `first_delay`
    /// doubled per consecutive failure, stretched by `1 + jitter` (`jitter`
    /// in `[0, 1)`), at most `max_delay`. A run of `reset_after` or longer
    /// starts the doubling over.
    pub fn failed(&mut self, uptime: Duration, jitter: f64) -> Duration {
        if uptime >= self.policy.reset_after {
            self.consecutive = 0;
        }
        let doublings = self.consecutive.min(32);
        let base = self.policy.first_delay.saturating_mul(1u32 << doublings.min(31));
        let jitter = if jitter.is_finite() { jitter.clamp(0.0, 1.0) } else { 0.0 };
        let delay = base.mul_f64(1.0 + jitter).min(self.policy.max_delay);
        self.consecutive = self.consecutive.saturating_add(1);
        delay
    }

    /// Records that a restart begins at `now`.
    pub fn restarting(&mut self, now: Instant) {
        self.total += 1;
        self.recent.push_back(now);
        while self.recent.len() > self.policy.crash_loop_restarts as usize {
            self.recent.pop_front();
        }
    }

    /// Restarts recorded so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Until when the restarts so far make a crash loop (`crash_loop_restarts`
    /// of them within `crash_loop_window`), if they do at `now`.
    pub fn crash_loop_until(&self, now: Instant) -> Option<Instant> {
        if self.recent.len() < self.policy.crash_loop_restarts as usize {
            return None;
        }
        let oldest = *self.recent.front()?;
        let until = oldest + self.policy.crash_loop_window;
        (now < until).then_some(until)
    }

    /// Whether the restarts so far are a crash loop at `now`.
    pub fn crash_loop(&self, now: Instant) -> bool {
        self.crash_loop_until(now).is_some()
    }
}

/// A jitter value in `[0, 1)`: spreads the restarts of computes that failed
/// together.
pub fn random_jitter() -> f64 {
    strata_service::backoff::random_fraction()
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_service::clock::Clock;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let mut t = RestartTracker::new(RestartPolicy::default());
        assert_eq!(t.failed(Duration::ZERO, 0.0), ms(100));
        assert_eq!(t.failed(Duration::ZERO, 0.5), ms(300));
        assert_eq!(t.failed(Duration::ZERO, 0.0), ms(400));
        assert_eq!(t.failed(Duration::ZERO, 0.999), ms(800).mul_f64(1.999));
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            last = t.failed(Duration::ZERO, 0.0);
        }
        assert_eq!(last, Duration::from_secs(30));
        // Jitter never exceeds the cap either.
        assert_eq!(t.failed(Duration::ZERO, 0.9), Duration::from_secs(30));
        // Out-of-range jitter is clamped.
        let mut u = RestartTracker::new(RestartPolicy::default());
        assert_eq!(u.failed(Duration::ZERO, 7.0), ms(200));
        assert_eq!(u.failed(Duration::ZERO, f64::NAN), ms(200));
        assert_eq!(u.failed(Duration::ZERO, -1.0), ms(400));
    }

    #[test]
    fn first_restart_is_fast() {
        for jitter in [0.0, 0.3, 0.999] {
            let d = RestartTracker::new(RestartPolicy::default()).failed(Duration::from_secs(5), jitter);
            assert!(d >= ms(100) && d < ms(200), "{d:?}");
        }
    }

    #[test]
    fn a_long_run_resets_the_backoff() {
        let mut t = RestartTracker::new(RestartPolicy::default());
        for _ in 0..6 {
            t.failed(Duration::from_secs(1), 0.0);
        }
        assert_eq!(t.failed(Duration::from_secs(59), 0.0), ms(6400));
        assert_eq!(t.failed(Duration::from_secs(60), 0.0), ms(100));
        assert_eq!(t.failed(Duration::ZERO, 0.0), ms(200));
    }

    #[test]
    fn crash_loop_needs_enough_restarts_within_the_window() {
        let policy =
            RestartPolicy { crash_loop_restarts: 3, crash_loop_window: Duration::from_secs(60), ..Default::default() };
        let mut t = RestartTracker::new(policy);
        let t0 = strata_service::clock::ManualClock::new().now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        t.restarting(at(0));
        t.restarting(at(10));
        assert!(!t.crash_loop(at(10)));
        t.restarting(at(20));
        assert_eq!(t.total(), 3);
        assert!(t.crash_loop(at(20)));
        // It lasts until the oldest of those restarts leaves the window.
        assert_eq!(t.crash_loop_until(at(30)), Some(at(60)));
        assert!(t.crash_loop(at(59)));
        assert!(!t.crash_loop(at(60)));
        // Spread-out restarts are no loop.
        t.restarting(at(100));
        assert!(!t.crash_loop(at(100)));
        t.restarting(at(130));
        assert!(!t.crash_loop(at(130)), "20, 100 and 130 are not within 60 s");
        t.restarting(at(140));
        assert!(t.crash_loop(at(140)));
        assert_eq!(t.crash_loop_until(at(140)), Some(at(160)));
        assert_eq!(t.total(), 6);
        assert!(t.recent.len() <= 3, "memory is bounded");
    }

    #[test]
    fn policy_validation() {
        RestartPolicy::default().validate().unwrap();
        assert!(RestartPolicy { first_delay: Duration::ZERO, ..Default::default() }.validate().is_err());
        assert!(RestartPolicy { max_delay: ms(10), ..Default::default() }.validate().is_err());
        assert!(RestartPolicy { crash_loop_restarts: 0, ..Default::default() }.validate().is_err());
        assert!(RestartPolicy { crash_loop_window: Duration::ZERO, ..Default::default() }.validate().is_err());
    }

    #[test]
    fn jitter_is_in_range_and_varies() {
        let values: Vec<f64> = (0..64).map(|_| random_jitter()).collect();
        assert!(values.iter().all(|v| (0.0..1.0).contains(v)), "{values:?}");
        assert!(values.windows(2).any(|w| w[0] != w[1]), "{values:?}");
    }
}
