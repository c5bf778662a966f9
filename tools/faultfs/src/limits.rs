//! Every bound of the fault-injecting file system: what grows with load or
//! time and where it stops.
//!
//! The file system itself holds nothing beyond what the passthrough does;
//! its main thread only waits for a signal or for the mount to end.

use std::time::Duration;

/// How long the main thread waits for a signal before it checks whether the
/// mount was ended from outside: short enough that an outside unmount is
/// noticed at once, long enough that the wait costs nothing.
pub const SIGNAL_POLL: Duration = Duration::from_millis(200);

// A zero wait would spin; a wait of a second or more would hold up a test's
// SIGTERM or an outside unmount noticeably.
const _: () = assert!(0 < SIGNAL_POLL.as_millis() && SIGNAL_POLL.as_millis() < 1000);
