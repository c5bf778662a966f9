//! Every bound of the `strata` binary's own roles: what grows with load or
//! time and where it stops.
//!
//! The services' bounds live in their crates; here are those of the
//! supervisor, the compute agent's proposer role and status server, the
//! benchmark, and the defaults of the options that bound them.

use std::time::Duration;

// ---- supervisor

/// After SIGKILL, how long the service's process group gets to disappear.
pub const KILL_WAIT: Duration = Duration::from_secs(10);
/// On SIGTERM, how long the service gets to exit before it is killed, by default.
pub const DEFAULT_GRACE_SECS: u64 = 30;

// ---- compute agent (proposer role)

/// WAL kept in memory for safekeepers that have not acknowledged it, by default (MiB).
pub const DEFAULT_MAX_BUFFER_MB: usize = 256;
/// Default bound on how far WAL consumers may lag before commits wait (MiB).
pub const DEFAULT_MAX_CONSUMER_LAG_MB: u64 = 1024;
/// Connections to the proposer's status server at once: scrapers and operators.
pub const STATUS_MAX_CONNECTIONS: usize = 32;
/// Longest a new status connection may take to complete its TLS greeting.
pub const STATUS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent's exit waits for its runtime's threads. Its work is
/// done by then (PostgreSQL stopped, its WAL on the safekeepers) and its
/// tasks drop within milliseconds; what outlives them are blocking calls
/// whose answers nobody awaits, such as the storage controller's long
/// poll, which would otherwise hold every endpoint stop up this long.
pub const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_millis(20);
/// Largest local file cache of a lazy compute that may be asked for (MiB).
pub const MAX_CACHE_MB: u64 = 1 << 30;

// ---- benchmark

/// Pause before a benchmark connection that failed is opened again.
pub const PAGEBENCH_RECONNECT_PAUSE: Duration = Duration::from_millis(100);
/// Longest the loopback baseline waits for a client's next request.
pub const LOOPBACK_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

// The supervisor's wait after SIGKILL fits in the margin beyond the grace
// period that the control plane gives a supervisor to stop its service.
const _: () = assert!(KILL_WAIT.as_millis() < strata_control_plane::limits::SUPERVISOR_MARGIN.as_millis());
// The defaults in MiB are converted to bytes (`<< 20`) without overflow.
const _: () = assert!(DEFAULT_MAX_BUFFER_MB <= usize::MAX >> 20);
const _: () = assert!(DEFAULT_MAX_CONSUMER_LAG_MB <= u64::MAX >> 20 && MAX_CACHE_MB <= u64::MAX >> 20);
// The status server admits at least one connection.
const _: () = assert!(STATUS_MAX_CONNECTIONS >= 1);

/// How long a follower waits, once its relay stopped, for a quorum of
/// safekeepers to hold all the relay sent.
pub const FOLLOW_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
