//! The pageserver's time: every component reads it from the
//! [`Clock`] of its [`TimelineResources`](crate::timeline::TimelineResources)
//! (the real one in a running pageserver, a `ManualClock` in tests). The
//! pageserver's own threads (WAL receivers, flushers, the compactor) wait on
//! it with `Clock::sleep_blocking`, outside any runtime.

use std::sync::Arc;

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
