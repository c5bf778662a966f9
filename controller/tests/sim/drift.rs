//! A controller's own clock: the run's manual clock seen at a slightly
//! different rate, as machines' clocks run. The lease's quarter-lease
//! margin (`docs/storage-controller.md`, "The lease") is what keeps two
//! controllers from leading at once when their rates differ.

use std::time::{Duration, Instant, SystemTime};

use strata_service::clock::{Clock, ManualClock, Sleep};

/// `base` running at `rate` (1.0: the same).
pub struct DriftClock {
    base: ManualClock,
    rate: f64,
    /// The base's elapsed time and this clock's instant when it was made.
    start: (Duration, Instant),
}

impl DriftClock {
    pub fn new(base: ManualClock, rate: f64) -> DriftClock {
        debug_assert!(rate > 0.5 && rate < 2.0);
        let start = (base.elapsed(), base.now());
        DriftClock { base, rate, start }
    }
}

impl Clock for DriftClock {
    fn now(&self) -> Instant {
        self.start.1 + (self.base.elapsed() - self.start.0).mul_f64(self.rate)
    }

    fn system_now(&self) -> SystemTime {
        self.base.system_now()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        // Rounded up: a sleep never ends before this clock has advanced by `duration`.
        self.base.sleep(duration.div_f64(self.rate) + Duration::from_micros(1))
    }
}
