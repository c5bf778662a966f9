//! Every bound of the safekeeper: what grows with load or time and where it
//! stops (connections, buffers and messages, timeouts, polling and retry
//! intervals, backoffs, retention), and the defaults of the configurable
//! ones. Format constants (file names, versions) stay with their formats.
//!
//! The relations between them are checked when the crate compiles (the
//! `const _` items at the end), so that changing one bound cannot quietly
//! break another.

use std::time::Duration;

use strata_protocol::safekeeper::codec::MAX_FRAME_SIZE;

// Configuration defaults and the ranges `SafekeeperConfig::validate` accepts.

/// Default longest silence on a proposer or consumer connection.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default time a pageserver of a superseded attachment generation is still fed.
pub const DEFAULT_STALE_STREAM_GRACE: Duration = Duration::from_secs(10);
/// Default most WAL sent to a consumer in one message.
pub const DEFAULT_MAX_SEND_BYTES: usize = 1 << 20;
/// Largest `max_send_bytes` accepted.
pub const MAX_SEND_BYTES_LIMIT: usize = 16 << 20;
/// Default most connections on the protocol listener.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default most connections on the HTTP listener.
pub const DEFAULT_MAX_HTTP_CONNECTIONS: usize = 64;
/// Default most connections on the PostgreSQL-protocol listener.
pub const DEFAULT_MAX_PG_CONNECTIONS: usize = 32;
/// Largest connection limit accepted for any listener.
pub const MAX_CONNECTIONS_LIMIT: usize = 100_000;
/// Default longest a new connection may take to send its greeting.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default longest committed WAL stays on the safekeepers' disks only.
pub const DEFAULT_PARTIAL_OFFLOAD_AFTER: Duration = Duration::from_secs(60);
/// Default time offloaded WAL is kept in object storage (a week).
pub const DEFAULT_WAL_ARCHIVE_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Descriptors kept for everything but client connections: WAL segments
/// and control files, peer and recovery connections, logs.
pub const RESERVED_FILES: usize = 256;

// Decoded streams (`decoded_stream`).

/// Chunks of decoded records a timeline keeps for its shards' streams.
pub const DECODED_CACHE_CHUNKS: usize = 8;
/// ... and their bytes at most (the newest chunk is always kept).
pub const DECODED_CACHE_BYTES: usize = 32 << 20;
/// WAL read per step while decoding a chunk.
pub const DECODED_READ_STEP: usize = 256 << 10;

// The safekeeper protocol's connections.

/// Time allowed for a peer to take what we send.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Keepalive interval for idle consumer streams.
pub const CONSUMER_KEEPALIVE: Duration = Duration::from_secs(5);
/// Capacity a consumer stream's output buffer keeps between messages; a
/// larger one (a chunk of catch-up WAL) is let go, so that an idle stream
/// costs no more than its keepalives need.
pub const IDLE_STREAM_BUFFER: usize = 64 << 10;
/// Most appends written before one flush (bounds the latency of the first).
pub const MAX_APPENDS_PER_FLUSH: usize = 256;
/// Under load the positions change at every append and every commit: a
/// consumer woken with less than [`CONSUMER_GATHER_BYTES`] to send waits
/// this long first, so that one wake-up and one message carry several.
pub const CONSUMER_GATHER_DELAY: Duration = Duration::from_millis(2);
/// What is worth sending at once, without gathering more.
pub const CONSUMER_GATHER_BYTES: u64 = 64 << 10;
/// WAL within this many bytes of the flush LSN was written moments ago and
/// is read in place (from the page cache); older WAL may have to come from
/// the disk, and is read off the async worker.
pub const RECENT_WAL_BYTES: u64 = 1 << 20;
/// Open segment files kept at once, per timeline.
pub const MAX_OPEN_SEGMENTS: usize = 4;
/// Removed segments kept, per timeline, to become the next new ones
/// (`wal_store.rs`, "Recycled segments"): their blocks are allocated, so
/// an append's fdatasync writes data only, not the file system's metadata.
pub const MAX_SPARE_SEGMENTS: usize = 2;
/// Most often a timeline's control file is rewritten after acceptor calls
/// (so restarts scan little WAL without a write per append).
pub const PERSIST_EVERY: Duration = Duration::from_secs(1);

// PostgreSQL's replication protocol (`pg_server`).

/// Largest message accepted from a replication client.
pub const PG_MAX_MESSAGE: usize = 1 << 20;
/// Bytes asked of a replication client's socket per read.
pub const PG_READ_CHUNK: usize = 8 << 10;
/// Keepalive interval for idle replication streams.
pub const PG_KEEPALIVE: Duration = Duration::from_secs(10);
/// Longest a client may take to send a message it started, or to take what we send.
pub const PG_IO_TIMEOUT: Duration = Duration::from_secs(60);

// Peers (`peers`).

/// How often each peer is asked for its positions.
pub const PEER_POLL: Duration = Duration::from_secs(1);
/// Longest wait for one peer's answer.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest peer answer read (about 200 bytes per timeline).
pub const PEER_MAX_ANSWER: u64 = 64 << 20;
/// A peer that has not answered for this long is taken for dead.
pub const LIVE_FOR: Duration = Duration::from_secs(10);

// Replicas' feedback (`standby_feedback`).

/// A replica's feedback that was not renewed for this long no longer
/// counts (PostgreSQL sends it at every status interval, 1 s on replicas).
pub const FEEDBACK_TTL: Duration = Duration::from_secs(60);

// Peer recovery (`recovery`).

/// How far behind a peer's commit LSN a timeline must be before recovery
/// starts; below it the proposer's own stream catches the safekeeper up.
pub const RECOVERY_THRESHOLD_BYTES: u64 = 8 << 20;
/// A timeline no proposer has written to for this long is recovered
/// however little it lacks: no proposer is catching it up (it is not a
/// member yet, or it was too far behind the proposer's buffer).
pub const NO_PROPOSER_AFTER: Duration = Duration::from_secs(5);
/// How often each recovery worker checks the timelines.
pub const RECOVERY_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes written per flush during recovery.
pub const RECOVERY_FLUSH_BYTES: usize = 16 << 20;
/// Bound on connecting to a peer and on its first answer.
pub const RECOVERY_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// First delay before a recovery worker tries its peer again after a failure.
pub const RECOVERY_MIN_BACKOFF: Duration = Duration::from_millis(500);
/// Longest delay before a recovery worker tries its peer again.
pub const RECOVERY_MAX_BACKOFF: Duration = Duration::from_secs(30);

// Each timeline's background work (`manager`, `offload`, `removal`).

/// How often the registry is compared with the managers running: a new
/// timeline's manager starts within this, a deleted one's stops within it.
pub const SUPERVISE_EVERY: Duration = Duration::from_millis(500);
/// How often the offload looks at a timeline.
pub const OFFLOAD_TICK: Duration = Duration::from_secs(1);
/// Most segments one timeline offloads per tick.
pub const OFFLOAD_SEGMENTS_PER_TICK: usize = 8;
/// Longest one upload attempt may take (16 MiB even over a slow link).
pub const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// Attempts per object storage call of the offload: one, as the tick is the
/// retry and errors show at once.
pub const UPLOAD_ATTEMPTS: u32 = 1;
/// Shortest and longest delay between attempts of one object storage call.
pub const UPLOAD_RETRY_DELAYS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));
/// How often the offloader looks for archived segments past their retention.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(60);
/// How often the removal looks at a timeline.
pub const REMOVAL_TICK: Duration = Duration::from_secs(1);
/// A timeline's removal round whose inputs did not change is skipped, but
/// never more than this many in a row: what the skipped rounds could not
/// see (the truncate LSN a proposer moved on its own) is acted on within
/// this many ticks.
pub const REMOVAL_FULL_ROUND_EVERY: u32 = 60;

// Healing of failed timelines (`healing`).

/// How often failed timelines are looked for.
pub const HEALING_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// First delay before a failed timeline is re-read.
pub const HEALING_MIN_DELAY: Duration = Duration::from_secs(1);
/// Longest delay between re-reads of a failed timeline.
pub const HEALING_MAX_DELAY: Duration = Duration::from_secs(60);
/// A timeline active this long after a reload starts over with the shortest delay.
pub const STABLE_AFTER: Duration = Duration::from_secs(60);

/// `d` in milliseconds, for the checks below (durations do not compare in `const`).
const fn ms(d: Duration) -> u128 {
    d.as_millis()
}

// A peer is asked several times within the staleness timeout, even when
// one answer takes its whole timeout: one slow or lost answer does not make
// a live peer look dead (and move the offload away from it).
const _: () = assert!(ms(PEER_POLL) + ms(PEER_TIMEOUT) < ms(LIVE_FOR) && 3 * ms(PEER_POLL) <= ms(LIVE_FOR));
// A consumer hears a keepalive well before its idle timeout runs out, and so
// does a replication client before its I/O timeout.
const _: () = assert!(2 * ms(CONSUMER_KEEPALIVE) <= ms(DEFAULT_IDLE_TIMEOUT));
const _: () = assert!(IDLE_STREAM_BUFFER < DEFAULT_MAX_SEND_BYTES);
const _: () = assert!(2 * ms(PG_KEEPALIVE) <= ms(PG_IO_TIMEOUT));
// The greeting is due before a connection could be closed for idling.
const _: () = assert!(ms(DEFAULT_HANDSHAKE_TIMEOUT) <= ms(DEFAULT_IDLE_TIMEOUT));
// The largest WAL message sent to a consumer fits the protocol's frame,
// with room for its fixed fields.
const _: () = assert!(MAX_SEND_BYTES_LIMIT + 256 <= MAX_FRAME_SIZE);
const _: () = assert!(DEFAULT_MAX_SEND_BYTES >= 1 && DEFAULT_MAX_SEND_BYTES <= MAX_SEND_BYTES_LIMIT);
// The default connection limits are within the accepted range, and with
// the reserve they fit the usual soft limit of 1024 open files.
const _: () = assert!(
    DEFAULT_MAX_CONNECTIONS <= MAX_CONNECTIONS_LIMIT
        && DEFAULT_MAX_HTTP_CONNECTIONS <= MAX_CONNECTIONS_LIMIT
        && DEFAULT_MAX_PG_CONNECTIONS <= MAX_CONNECTIONS_LIMIT
);
const _: () = assert!(
    DEFAULT_MAX_CONNECTIONS + DEFAULT_MAX_HTTP_CONNECTIONS + DEFAULT_MAX_PG_CONNECTIONS + RESERVED_FILES <= 1024
);
// A read buffer holds at least one chunk below the largest message.
const _: () = assert!(PG_READ_CHUNK <= PG_MAX_MESSAGE);
// Retries back off from short to long, and the healing task looks at least
// as often as its shortest delay.
const _: () = assert!(ms(RECOVERY_MIN_BACKOFF) <= ms(RECOVERY_MAX_BACKOFF));
const _: () = assert!(ms(HEALING_MIN_DELAY) <= ms(HEALING_MAX_DELAY));
const _: () = assert!(ms(HEALING_CHECK_INTERVAL) <= ms(HEALING_MIN_DELAY));
const _: () = assert!(ms(UPLOAD_RETRY_DELAYS.0) <= ms(UPLOAD_RETRY_DELAYS.1) && UPLOAD_ATTEMPTS >= 1);
// A recovery worker notices a timeline left without a proposer within a
// few checks.
const _: () = assert!(ms(RECOVERY_CHECK_INTERVAL) < ms(NO_PROPOSER_AFTER));
// A replica's feedback survives several lost messages at PostgreSQL's
// default status interval (10 s).
const _: () = assert!(ms(FEEDBACK_TTL) >= 3 * 10_000);
// The committed tail reaches object storage long before the archive's
// oldest segments expire, and the archive is looked at within its retention.
const _: () = assert!(ms(DEFAULT_PARTIAL_OFFLOAD_AFTER) < ms(DEFAULT_WAL_ARCHIVE_RETENTION));
const _: () = assert!(ms(OFFLOAD_TICK) <= ms(EXPIRE_EVERY));
// A timeline's offload is taken over by another member within a few ticks
// of the staleness timeout.
const _: () = assert!(ms(OFFLOAD_TICK) < ms(LIVE_FOR) && ms(REMOVAL_TICK) < ms(LIVE_FOR));
const _: () = assert!(REMOVAL_FULL_ROUND_EVERY >= 1);
// One tick's uploads are bounded.
const _: () = assert!(OFFLOAD_SEGMENTS_PER_TICK >= 1 && MAX_APPENDS_PER_FLUSH >= 1 && MAX_OPEN_SEGMENTS >= 1);
