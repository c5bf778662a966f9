//! Every bound of the link proxy: what grows with load or time and where it
//! stops.
//!
//! Each direction of each relayed connection holds at most its byte budget
//! in a queue of bounded length; connections per route, the delay a route
//! may add and the wait for a route's target are bounded too.

use std::time::Duration;

// ---- relaying

/// Largest chunk read at once.
pub const RELAY_CHUNK: usize = 64 << 10;
/// Chunks queued at once (the byte budget binds first for chunks of 1 KiB and more).
pub const RELAY_QUEUE: usize = 1024;
/// Bytes of one direction of a connection held and not yet delivered, by default.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 1 << 20;
/// The range `max_in_flight_bytes` may be configured in.
pub const MIN_IN_FLIGHT_BYTES: usize = 1 << 10;
pub const MAX_IN_FLIGHT_BYTES: usize = 1 << 30;
/// Longest one-way delay accepted (a minute: anything more is a mistake).
pub const MAX_DELAY_MS: f64 = 60_000.0;
/// What a lost chunk waits before it comes again: Linux's least TCP
/// retransmission timeout.
pub const RETRANSMIT_TIMEOUT: Duration = Duration::from_millis(200);
/// Losses of one chunk in a row at most (each doubles the wait).
pub const MAX_RETRANSMISSIONS: u32 = 5;

// ---- routes

/// Connections per route at once, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Most connections per route that may be configured.
pub const MAX_CONNECTIONS: usize = 100_000;
/// Longest wait for a connection to a route's target, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after an accept error (out of descriptors and the like), so the
/// accept loop waits rather than spins.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

// ---- HTTP API

/// Connections to the HTTP API at once: only tests and operators call it.
pub const HTTP_MAX_CONNECTIONS: usize = 64;
/// Longest a new HTTP connection may take to complete its TLS greeting.
pub const HTTP_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

// The default budget is one the config accepts, and any accepted budget
// is at least one byte (the relay waits for room for a chunk).
const _: () = assert!(0 < MIN_IN_FLIGHT_BYTES && MIN_IN_FLIGHT_BYTES <= DEFAULT_MAX_IN_FLIGHT_BYTES);
const _: () = assert!(DEFAULT_MAX_IN_FLIGHT_BYTES <= MAX_IN_FLIGHT_BYTES);
// The budget is a semaphore of bytes, and a chunk is taken from it in one
// `acquire_many` (a u32).
const _: () = assert!(MAX_IN_FLIGHT_BYTES <= tokio::sync::Semaphore::MAX_PERMITS);
const _: () = assert!(RELAY_CHUNK as u64 <= u32::MAX as u64);
// With the default budget, the byte budget binds before the queue does for
// chunks of 1 KiB and more.
const _: () = assert!(RELAY_QUEUE * 1024 >= DEFAULT_MAX_IN_FLIGHT_BYTES);
// The default connection cap is one the config accepts.
const _: () = assert!(1 <= DEFAULT_MAX_CONNECTIONS && DEFAULT_MAX_CONNECTIONS <= MAX_CONNECTIONS);
// The default connect timeout can be written in the config's seconds.
const _: () = assert!(
    0 < DEFAULT_CONNECT_TIMEOUT.as_millis()
        && (DEFAULT_CONNECT_TIMEOUT.as_secs() as f64) <= strata_service::limits::MAX_CONFIG_SECONDS
);
// A delay, even doubled by the largest jitter, stays within a config's seconds.
const _: () = assert!(0.0 < MAX_DELAY_MS && 2.0 * MAX_DELAY_MS / 1000.0 <= strata_service::limits::MAX_CONFIG_SECONDS);
