//! The clock the compute's components read the time from: one handle,
//! carried in the configurations they are given ([`crate::proposer::ProposerConfig`],
//! [`crate::agent::AgentConfig`], [`crate::page_client::PageClientConfig`]),
//! the real time unless a test gives a [`strata_service::clock::ManualClock`].

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use strata_service::clock::{Clock, SystemClock};

/// A shared [`Clock`]: cheap to clone, the real time by default.
#[derive(Clone)]
pub struct SharedClock(pub Arc<dyn Clock>);

impl SharedClock {
    /// A handle on `clock`.
    pub fn new(clock: impl Clock) -> SharedClock {
        SharedClock(Arc::new(clock))
    }
}

impl Default for SharedClock {
    fn default() -> SharedClock {
        SharedClock::new(SystemClock)
    }
}

impl From<Arc<dyn Clock>> for SharedClock {
    fn from(clock: Arc<dyn Clock>) -> SharedClock {
        SharedClock(clock)
    }
}

impl Deref for SharedClock {
    type Target = dyn Clock;

    fn deref(&self) -> &dyn Clock {
        &*self.0
    }
}

// The configurations that carry it print with `{:?}`; a clock has nothing to show.
impl fmt::Debug for SharedClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedClock")
    }
}

/// Seconds since the Unix epoch by `clock`'s wall time (0 before it).
pub fn unix_now(clock: &dyn Clock) -> u64 {
    clock.system_now().duration_since(std::time::SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
