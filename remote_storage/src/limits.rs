//! Every bound of the remote storage crate: what grows with load or time and
//! where it stops.
//!
//! Each operation is bounded in time (a timeout per attempt, a number of
//! attempts, capped pauses between them) and each transfer in memory (one
//! reused buffer per copy or download).

use std::time::Duration;

/// Longest wait for one attempt of one operation.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Attempts of an operation before its error is returned.
pub const DEFAULT_ATTEMPTS: u32 = 5;
/// Backoff between attempts: from 100 ms, doubling, up to 30 s, jittered.
pub const DEFAULT_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(30));

/// Buffer of a streaming copy into a local-directory store: large enough
/// that the copy costs about what the kernel's own copy does, and reused.
pub const COPY_CHUNK: usize = 1 << 20;
/// Age after which a staging file is taken to be left by a dead upload (a
/// live one writes to its file at least every chunk).
pub const STALE_STAGING: Duration = Duration::from_secs(600);

/// Write buffer of a download: the store's chunks are kilobytes, written a
/// MiB at a time.
pub const DOWNLOAD_WRITE_BUFFER: usize = 1 << 20;

/// How long a process uses the data keys of a tenant it read before
/// reading them again (a rotation by another process is seen within it).
pub const DATA_KEYS_REFRESH: Duration = Duration::from_secs(600);
/// Tenants whose unwrapped data keys a storage keeps in memory.
pub const MAX_CACHED_TENANTS: usize = 100_000;
/// Attempts of a read-modify-write of a data key object that others may
/// change at the same time (a rotation, a rewrap).
pub const KEY_OBJECT_ATTEMPTS: u32 = 5;
// The bounds of what a sealed object, a key object or a key file may hold
// (chunk size, keys per object, bytes) are part of their formats:
// `seal::format` and `seal::keys` (docs/sealed-objects.md).

/// Extra reads of a partial segment whose metadata and bytes disagree (a
/// newer round replaced one of them meanwhile) before it counts as damaged.
pub const PARTIAL_FETCH_RETRIES: u32 = 3;
/// Pause before such a read, for the round under way to finish.
pub const PARTIAL_FETCH_RETRY_WAIT: Duration = Duration::from_millis(500);

// An operation is tried at least once.
const _: () = assert!(DEFAULT_ATTEMPTS >= 1);
// The backoff starts above zero and grows to its cap.
const _: () =
    assert!(0 < DEFAULT_BACKOFF.0.as_millis() && DEFAULT_BACKOFF.0.as_millis() <= DEFAULT_BACKOFF.1.as_millis());
// A pause between attempts is shorter than one attempt may take: a failing
// operation ends through its attempts, not its pauses.
const _: () = assert!(DEFAULT_BACKOFF.1.as_millis() < DEFAULT_TIMEOUT.as_millis());
// A staging file is taken for dead only well after any remote attempt
// would have given up, so a slow but live upload keeps its file.
const _: () = assert!(STALE_STAGING.as_millis() >= 2 * DEFAULT_TIMEOUT.as_millis());
// Waiting out a partial segment's rewrite takes less than one attempt.
const _: () =
    assert!((PARTIAL_FETCH_RETRIES as u128) * PARTIAL_FETCH_RETRY_WAIT.as_millis() < DEFAULT_TIMEOUT.as_millis());
