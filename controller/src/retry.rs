//! Growing pauses before a failed call is sent again, per key (a
//! pageserver and a tenant): doubling from a minimum to a maximum, each
//! pause a random point in the upper half of its step, so that calls that
//! failed together spread out. The jitter comes from a seeded generator,
//! so that a simulated run replays exactly.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The pauses of every key that failed and has not succeeded since.
pub struct Retries<K> {
    min: Duration,
    max: Duration,
    rng: fastrand::Rng,
    /// When each key may be tried again, and its current step.
    pending: BTreeMap<K, (Instant, Duration)>,
}

impl<K: Ord> Retries<K> {
    pub fn new(min: Duration, max: Duration, seed: u64) -> Retries<K> {
        debug_assert!(!min.is_zero() && min <= max);
        Retries { min, max, rng: fastrand::Rng::with_seed(seed), pending: BTreeMap::new() }
    }

    /// Whether `key` is still pausing at `now`.
    pub fn waiting(&self, key: &K, now: Instant) -> bool {
        self.pending.get(key).is_some_and(|(at, _)| now < *at)
    }

    /// `key` failed at `now`: returns when it may be tried again.
    pub fn failed(&mut self, key: K, now: Instant) -> Instant {
        let (min, max) = (self.min, self.max);
        let (at, step) = self.pending.entry(key).or_insert((now, min));
        let pause = *step / 2 + step.mul_f64(self.rng.f64() / 2.0);
        debug_assert!(pause >= *step / 2 && pause <= *step);
        *at = now + pause;
        *step = (*step * 2).min(max);
        *at
    }

    /// `key` succeeded: its next failure starts from the shortest pause.
    pub fn succeeded(&mut self, key: &K) {
        self.pending.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_with_jitter_up_to_the_cap_and_reset_on_success() {
        let now = strata_service::clock::ManualClock::new();
        let now = strata_service::clock::Clock::now(&now);
        let mut r = Retries::new(Duration::from_millis(500), Duration::from_secs(10), 7);
        assert!(!r.waiting(&"a", now));
        for i in 0..8 {
            let step = (Duration::from_millis(500) * (1 << i)).min(Duration::from_secs(10));
            let pause = r.failed("a", now) - now;
            assert!(pause >= step / 2 && pause <= step, "failure {i}: {pause:?} for a step of {step:?}");
        }
        assert!(r.waiting(&"a", now) && !r.waiting(&"b", now));
        assert!(!r.waiting(&"a", now + Duration::from_secs(10)));
        r.succeeded(&"a");
        assert!(r.failed("a", now) - now <= Duration::from_millis(500));
        // The same seed gives the same pauses.
        let pauses = |seed| {
            let mut r = Retries::new(Duration::from_millis(500), Duration::from_secs(10), seed);
            (0..4).map(|_| r.failed(1, now)).collect::<Vec<_>>()
        };
        assert_eq!(pauses(3), pauses(3));
        assert_ne!(pauses(3), pauses(4));
    }
}
