//! One seeded generator for every randomized test: the same seed gives the
//! same run, and `STRATA_TEST_SEED` replaces a test's own seed to reproduce
//! (or vary) a run. The seed used is printed, so a failure's output names it.

pub use fastrand::Rng;

/// The environment variable that overrides every test's seed.
pub const SEED_VAR: &str = "STRATA_TEST_SEED";

/// A generator for the test `name`, seeded with `seed` unless
/// `STRATA_TEST_SEED` (decimal, or hexadecimal after `0x`) says otherwise.
pub fn seeded(name: &str, seed: u64) -> Rng {
    let seed = match std::env::var(SEED_VAR) {
        Ok(text) => parse_seed(&text).unwrap_or_else(|| panic!("{SEED_VAR}={text:?} is not a number")),
        Err(_) => seed,
    };
    eprintln!("{name}: seed {seed:#x} (set {SEED_VAR} to repeat it)");
    Rng::with_seed(seed)
}

/// What the randomized tests ask of a generator beyond `fastrand`'s own.
pub trait RngExt {
    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64;
    /// Uniform in `0..n` (0 when `n` is 0), for indexing.
    fn index(&mut self, n: usize) -> usize;
    /// True `percent` times in a hundred.
    fn chance(&mut self, percent: u64) -> bool;
    /// `n` random bytes.
    fn bytes(&mut self, n: usize) -> Vec<u8>;
}

impl RngExt for Rng {
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.u64(..n)
        }
    }

    fn index(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.usize(..n)
        }
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.u64(..100) < percent
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = vec![0; n];
        self.fill(&mut out);
        out
    }
}

fn parse_seed(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_run() {
        let a: Vec<u64> = {
            let mut r = Rng::with_seed(7);
            (0..8).map(|_| r.u64(..)).collect()
        };
        let mut r = Rng::with_seed(7);
        assert_eq!(a, (0..8).map(|_| r.u64(..)).collect::<Vec<_>>());
        assert_ne!(a, {
            let mut r = Rng::with_seed(8);
            (0..8).map(|_| r.u64(..)).collect::<Vec<_>>()
        });
        let mut r = Rng::with_seed(1);
        assert_eq!(r.below(0), 0);
        assert!((0..1000).all(|_| r.below(10) < 10));
        assert!(!(0..100).any(|_| r.chance(0)) && (0..100).all(|_| r.chance(100)));
        let hits = (0..10_000).filter(|_| r.chance(30)).count();
        assert!((2_500..3_500).contains(&hits), "{hits}");
        assert_eq!(r.bytes(33).len(), 33);
        assert_eq!(parse_seed("0x1F"), Some(31));
        assert_eq!(parse_seed(" 12 "), Some(12));
        assert_eq!(parse_seed("twelve"), None);
    }
}
