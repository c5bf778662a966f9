//! Exponential backoff with jitter, for every retry loop: retries of many
//! peers that failed together spread out instead of arriving in step.

use std::hash::BuildHasher;
use std::time::Duration;

/// Delays that double from `min` to `max`; each delay drawn is a random
/// point in the upper half of the current step.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        debug_assert!(min <= max && !min.is_zero());
        Backoff { min, max, current: min }
    }

    /// The next delay to wait (then the step doubles, up to `max`).
    pub fn next_delay(&mut self) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max);
        step / 2 + step.mul_f64(random_fraction() / 2.0)
    }

    /// Back to the shortest delay (after a success).
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

/// A random number in [0, 1): the standard library's per-instance random
/// hasher keys are enough for jitter.
pub fn random_fraction() -> f64 {
    let bits = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let step = Duration::from_millis(100 * (1 << i.min(4))).min(Duration::from_secs(1));
            assert!(*d >= step / 2 && *d <= step, "delay {i}: {d:?} for a step of {step:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
        let spread: std::collections::HashSet<u128> = (0..20)
            .map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_delay().as_nanos())
            .collect();
        assert!(spread.len() > 10, "jitter spreads delays");
    }
}
