//! Every bound of the storage controller: what grows with load or time and
//! where it stops.
//!
//! The leader's lease, the heartbeats and the calls to object storage and to
//! the pageservers are bounded in time so that a hung peer or store cannot
//! keep a controller leading past its lease; answers, retries and the
//! secondaries of a tenant are bounded in number.

use std::time::Duration;

// ---- the computes' tokens

/// How long a renewed compute token lasts when the one it renews never
/// expired (those the CLI hands out last an hour, and so do their renewals).
pub const RENEWED_TOKEN_TTL: Duration = Duration::from_secs(3600);
const _: () = assert!(RENEWED_TOKEN_TTL.as_secs() <= strata_service::limits::MAX_ISSUED_TTL.as_secs());

// ---- heartbeats and the lease (defaults of `controller.toml`)

/// How often every pageserver is asked for its status, by default.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// A pageserver silent for this long is offline, by default.
pub const DEFAULT_OFFLINE_AFTER: Duration = Duration::from_secs(2);
/// How long the leader's lease lasts without renewal, by default.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(6);
/// Renewals of the lease within one lease period: one or two lost writes
/// must not cost the lead.
pub const LEASE_RENEWALS_PER_TTL: u32 = 4;
/// Shortest timeout of a heartbeat call, whatever the interval: a loaded
/// pageserver answers in well under a second.
pub const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a follower reads the state (computes may ask any controller).
pub const FOLLOWER_REFRESH: Duration = Duration::from_secs(1);

// ---- object storage

/// Bound on one attempt of one operation: a controller whose storage
/// hangs must still notice that its lease ran out.
pub const STORE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Attempts of one storage operation.
pub const STORE_ATTEMPTS: u32 = 2;
/// Pauses between those attempts.
pub const STORE_RETRY_MIN: Duration = Duration::from_millis(50);
pub const STORE_RETRY_MAX: Duration = Duration::from_millis(200);
/// Bound on writing the state when a write conflicts again and again.
pub const WRITE_ATTEMPTS: usize = 5;

// ---- pageserver calls

/// Largest answer accepted (a status lists every timeline).
pub const MAX_ANSWER: u64 = 16 << 20;
/// Bound on a location change: an attach lists and reads every index.
pub const LOCATION_TIMEOUT: Duration = Duration::from_secs(120);

/// A split's call to a parent's pageserver: it flushes and uploads every
/// timeline (up to a minute each) before it writes the children's indexes.
pub const SPLIT_CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// Failed calls to a parent's pageserver after which a split rolls back
/// (each retried after the location calls' growing pause).
pub const SPLIT_ATTEMPTS: u32 = 6;

/// How long a done split's shards must keep naming no other shard's layers
/// (heartbeat after heartbeat) before the parents' objects are swept.
pub const SPLIT_SWEEP_SETTLE: Duration = Duration::from_secs(20);
/// Pauses before a failed location call is sent again.
pub const RETRY_MIN: Duration = Duration::from_millis(500);
pub const RETRY_MAX: Duration = Duration::from_secs(10);

// ---- placement

/// Most secondaries a tenant keeps (a returning failed pageserver and a
/// warm one elsewhere).
pub const MAX_SECONDARIES: usize = 2;

// ---- HTTP API

/// Longest a long poll waits for a newer state.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// Connections on the HTTP API at once, by default (computes long-poll it).
pub const DEFAULT_MAX_HTTP_CONNECTIONS: usize = 1024;

/// The size policy's defaults (`docs/sharding.md`, "Size policy"): a shard
/// over 16 GiB of its own layers splits its tenant; an unsharded tenant
/// into 4, then doubling up to 16.
pub const DEFAULT_SPLIT_SHARD_BYTES: u64 = 16 << 30;
pub const DEFAULT_SPLIT_FIRST_SHARDS: u8 = 4;
pub const DEFAULT_SPLIT_MAX_SHARDS: u8 = 16;
/// Most connections the HTTP API may be configured for.
pub const MAX_HTTP_CONNECTIONS: usize = 100_000;
/// Longest a new HTTP connection may take to complete its TLS greeting.
pub const HTTP_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

// The defaults pass the config's own check: one lost answer is not a failure.
const _: () = assert!(DEFAULT_OFFLINE_AFTER.as_millis() >= 2 * DEFAULT_HEARTBEAT_INTERVAL.as_millis());
// A heartbeat that takes its whole timeout still lands before the
// pageserver would be declared offline.
const _: () = assert!(MIN_HEARTBEAT_TIMEOUT.as_millis() < DEFAULT_OFFLINE_AFTER.as_millis());
// The lease is renewed more than once per period, so a single failed
// renewal leaves another before it runs out.
const _: () = assert!(LEASE_RENEWALS_PER_TTL >= 2);
// One storage operation, every attempt and pause included, gives up within
// the three quarters of a lease the leader trusts: a hung store cannot keep
// a controller leading past its lease.
const _: () = assert!(
    STORE_ATTEMPTS as u128 * STORE_ATTEMPT_TIMEOUT.as_millis()
        + (STORE_ATTEMPTS as u128 - 1) * STORE_RETRY_MAX.as_millis()
        < DEFAULT_LEASE_TTL.as_millis() * 3 / 4
);
// A follower's view of the state is never older than a lease.
const _: () = assert!(FOLLOWER_REFRESH.as_millis() < DEFAULT_LEASE_TTL.as_millis());
// Operations are tried at least once; backoffs grow to their caps.
const _: () = assert!(STORE_ATTEMPTS >= 1 && WRITE_ATTEMPTS >= 1);
const _: () = assert!(0 < STORE_RETRY_MIN.as_millis() && STORE_RETRY_MIN.as_millis() <= STORE_RETRY_MAX.as_millis());
const _: () = assert!(0 < RETRY_MIN.as_millis() && RETRY_MIN.as_millis() <= RETRY_MAX.as_millis());
// The default connection cap is one the config accepts.
const _: () = assert!(1 <= DEFAULT_MAX_HTTP_CONNECTIONS && DEFAULT_MAX_HTTP_CONNECTIONS <= MAX_HTTP_CONNECTIONS);
