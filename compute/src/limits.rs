//! Every bound of the compute crate: what grows with load or time and where
//! it stops. Queues, buffers, batches and caches have a size here; every
//! wait has a timeout and every retry a pause and an end. The relations
//! between them that the code relies on are checked when it compiles (the
//! `const _` assertions at the end).

use std::time::Duration;

use strata_formats::version::BLCKSZ;
use strata_protocol::pageserver::MAX_PIPELINE_DEPTH;
use strata_protocol::safekeeper::codec::MAX_FRAME_SIZE;

// The proposer (`crate::proposer`).

/// How long a commit LSN waits for WAL to carry it to the safekeepers
/// before it is sent on its own. Only the WAL's consumers (which read
/// committed WAL) wait for it; PostgreSQL's commits do not.
pub const COMMIT_UPDATE_DELAY: Duration = Duration::from_millis(2);

/// Batches of received WAL whose wait for an acknowledgement is timed at
/// once (the commit latency the console graphs); more waiting batches are
/// timed with the next one.
pub const ACK_WAITS: usize = 1024;
/// Longest the proposer waits for a quorum of safekeepers: to elect it,
/// and in sync-safekeepers to hold and commit the WAL up to the epoch start.
pub const QUORUM_WAIT: Duration = Duration::from_secs(600);
/// How long a link asked for its position goes unanswered before it is
/// asked again (a link left behind catches up from its peers meanwhile).
pub const POSITION_RETRY: Duration = Duration::from_secs(2);
/// How often the proposer looks for links whose position to ask again.
pub const LAGGING_CHECK_INTERVAL: Duration = Duration::from_millis(20);
/// Longest PostgreSQL goes without a status report from the proposer (its
/// keepalive) while nothing new is acknowledged.
pub const STATUS_REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// The pause after the last commit LSN was queued, for the links to
/// deliver it before the proposer returns.
pub const LAST_COMMIT_DELIVERY: Duration = Duration::from_millis(50);
/// Default bound on every network wait of the proposer.
pub const PROPOSER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default WAL held in memory for acceptors that have not acknowledged it.
pub const PROPOSER_MAX_BUFFER_BYTES: usize = 256 << 20;
/// Default largest append sent at once.
pub const PROPOSER_MAX_APPEND_BYTES: usize = 128 << 10;
/// Default unacknowledged bytes in flight per safekeeper.
pub const PROPOSER_MAX_IN_FLIGHT_BYTES: u64 = 16 << 20;
/// Events from all links to the proposer's core, queued.
pub const LINK_EVENTS_CAPACITY: usize = 1024;
/// Commands from the core to one link, queued; a full queue drops the
/// command (the link catches up from its acknowledged position later).
pub const LINK_COMMANDS_CAPACITY: usize = 256;

// The proposer's links to the safekeepers (`crate::safekeeper_link`).

/// Longest silence from a connected safekeeper before the link gives up
/// on it (beyond the safekeepers' default idle timeout of 60 s).
pub const IDLE_READ_TIMEOUT: Duration = Duration::from_secs(120);
/// The first wait before a lost link connects again; it doubles after each attempt.
pub const LINK_FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The least wait between attempts once a link has connected before (a
/// safekeeper that accepts and then drops it is not hammered).
pub const LINK_RECONNECT_MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
pub const LINK_MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Queued commands drained into one write, up to about this many bytes.
pub const LINK_MAX_WRITE_BATCH: usize = 4 << 20;

// WAL from a donor safekeeper (`crate::wal_fetch`).

/// The most WAL fetched from a donor at once.
pub const MAX_WAL_FETCH_BYTES: usize = 1 << 30;

// PostgreSQL's replication protocol (`crate::pg_replication`).

/// Largest message accepted from the server (type byte excluded, length
/// field included). WAL arrives in chunks of at most 128 KiB; the rest are
/// small.
pub const MAX_MESSAGE_LEN: usize = 64 << 20;
/// How much room is made in the read buffer at least before each read.
pub const READ_CHUNK: usize = 16 << 10;
/// Read buffer capacity above which an emptied buffer is shrunk again.
pub const SHRINK_ABOVE: usize = 1 << 20;
/// Longest replication slot name (`NAMEDATALEN - 1`).
pub const MAX_SLOT_NAME_LEN: usize = 63;

// The page service client (`crate::page_client`).

/// Default limit for the TCP connection and the handshake together.
pub const PAGE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default longest wait for one response (beyond the pageserver's own wait
/// for an LSN to be ingested).
pub const PAGE_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

// Following the tenant's attachment (`crate::pageserver_target`).

/// Longest a long poll of a controller waits (it answers at once when the state changes).
/// How often the agent looks whether its token is due for renewal (a third
/// of its life left, or a newer key trusted).
pub const TOKEN_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How long a renewal call to one controller may take.
pub const TOKEN_RENEW_TIMEOUT: Duration = Duration::from_secs(10);
pub const CONTROLLER_LONG_POLL: Duration = Duration::from_secs(25);
/// Pause before the next controller after one did not answer.
pub const CONTROLLER_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// While a compute that asked for its site's reader is served by the
/// attached pageserver instead (the reader is loading, or down), how often
/// it asks again: a reader becoming ready changes no state version.
pub const READER_RETRY: Duration = Duration::from_secs(2);

// The lazy file system (`crate::lazy`).

/// How long a fetch keeps trying by default while the pageserver cannot be
/// reached (a restart under its supervisor takes seconds): the query waits
/// instead of failing. Past this, or on any other failure, the read is an
/// I/O error.
pub const LAZY_FETCH_RETRY_FOR: Duration = Duration::from_secs(20);
/// The first pause between a lazy fetch's attempts; it doubles up to the next.
pub const LAZY_FETCH_FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between a lazy fetch's attempts.
pub const LAZY_FETCH_MAX_PAUSE: Duration = Duration::from_secs(1);
/// Connections per page source: as many as the file system has threads.
pub const PAGE_SOURCE_CONNECTIONS: usize = 4;
/// Blocks an eager compute of a sharded tenant reads per request while it
/// writes its relation files (`agent::materialize`), and its readers: one
/// per connection of the page source.
pub const MATERIALIZE_BATCH_BLOCKS: u32 = 32;
pub const MATERIALIZE_WORKERS: usize = PAGE_SOURCE_CONNECTIONS;
/// Threads of a lazy mount's daemon: a read waiting on the pageserver does
/// not hold up the others.
pub const LAZY_FS_THREADS: usize = 4;
/// How long the kernel caches attributes and names of a mount. Only the
/// mount changes its backing directory, so any length is safe; a long one
/// keeps PostgreSQL's many `lseek(SEEK_END)` calls (relation sizes) off
/// the daemon.
pub const KERNEL_CACHE_TTL: Duration = Duration::from_secs(60);
/// Prefetch windows (blocks): the first after a sequential read is
/// detected, doubling up to the largest.
pub const PREFETCH_MIN: u32 = 16;
/// The largest prefetch window (blocks).
pub const PREFETCH_MAX: u32 = 32;
/// How far the kernel reads ahead of sequential reads on a mount. Its
/// default for FUSE, 128 KiB, makes a cold sequential scan one round trip
/// per 16 blocks; a megabyte measured a sixth faster. The kernel sends a
/// read-ahead window as reads of at most a megabyte (FUSE's largest), so
/// four megabytes keep about four of them in flight, which the mount's
/// threads serve at once over the source's connections, the pageserver
/// and this daemon working side by side instead of in turn (a cold scan a
/// ninth faster than with one megabyte while fetched pages were all
/// stored, about the same since large scans are not). Eight measured the
/// same as four, sixteen slower.
pub const READ_AHEAD_KB: u32 = 4096;
/// The fewest backing files a mount keeps open, whatever the process's
/// descriptor limit.
pub const LAZY_MIN_OPEN_FILES: usize = 64;

// The agent (`crate::agent`).

/// Most bytes of a basebackup read after the end-of-archive marker.
pub const TRAILER_LIMIT: u64 = 1 << 20;
/// Copy buffer for a basebackup's file contents.
pub const COPY_BUFFER: usize = 256 << 10;
/// The largest lazy cache, in MiB (1 PiB: a typo, not a disk).
pub const MAX_LAZY_CACHE_MB: u64 = 1 << 30;
/// The longest a lazy read may keep retrying an unreachable pageserver.
pub const MAX_LAZY_FETCH_RETRY_SECS: u64 = 3600;
/// A replica's default bound on its lag in time, in seconds.
pub const DEFAULT_MAX_REPLICA_LAG_SECS: u64 = 900;
/// How often the cache learns how far the pageserver has ingested (written
/// blocks wait for that before they may be dropped).
pub const INGEST_POLL: Duration = Duration::from_millis(500);
/// How often the agent checks that the mounts' daemons still serve.
pub const MOUNT_WATCH: Duration = Duration::from_secs(1);
/// How long an unmounted mount's daemon thread is waited for. Another
/// mount namespace made while the mount existed (a container, a service
/// with a private `/tmp`) holds a copy that keeps the FUSE connection, and
/// so the thread, alive after the unmount here.
pub const UNMOUNT_JOIN_WAIT: Duration = Duration::from_secs(5);
/// Bound on each step of stopping a PostgreSQL an earlier agent left running.
pub const LEFTOVER_STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a process expected to exit is looked at again.
pub const PROCESS_EXIT_POLL: Duration = Duration::from_millis(20);
/// Bound on a JSON request to the pageserver (connect, send, receive the whole answer).
pub const PAGESERVER_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on connecting to the pageserver for a basebackup.
pub const PAGESERVER_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the pageserver preparing a basebackup (until the headers arrive).
pub const BASEBACKUP_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on each read of the basebackup stream: a stalled transfer fails.
pub const BASEBACKUP_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest JSON answer accepted from the pageserver.
pub const MAX_JSON_BYTES: u64 = 1 << 20;
/// First pause between retries of an unreachable pageserver; it doubles up
/// to [`PAGESERVER_MAX_BACKOFF`].
pub const PAGESERVER_FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between retries of an unreachable pageserver.
pub const PAGESERVER_MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a start that finds its timeline missing on the pageserver it
/// asked waits for the storage controller to name another (the tenant
/// moved while the agent was down, or during the request).
pub const PAGESERVER_MOVE_PATIENCE: Duration = Duration::from_secs(10);
/// How often that wait looks at where the tenant is.
pub const PAGESERVER_MOVE_POLL: Duration = Duration::from_millis(100);
/// First pause while waiting for the pageserver to ingest the start LSN.
pub const INGEST_WAIT_FIRST_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause while waiting for the pageserver to ingest the start LSN.
pub const INGEST_WAIT_MAX_PAUSE: Duration = Duration::from_millis(250);
/// First pause while waiting for PostgreSQL to accept connections.
pub const READY_FIRST_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause while waiting for PostgreSQL to accept connections.
pub const READY_MAX_PAUSE: Duration = Duration::from_millis(50);
/// Bytes of PostgreSQL's log shown with an error.
pub const LOG_TAIL_BYTES: u64 = 4096;
/// Bytes of PostgreSQL's log searched for the reason of an exit.
pub const LOG_REASON_BYTES: u64 = 64 << 10;
/// Longest reason quoted from PostgreSQL's log.
pub const MAX_REASON_CHARS: usize = 300;
/// Bound on waiting for the server to exit after an immediate shutdown.
pub const IMMEDIATE_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a failed proposer waits for PostgreSQL's own exit, which is
/// then the cause to report (a crashed backend ends the replication stream
/// a moment before the postmaster exits).
pub const EXIT_ATTRIBUTION_WAIT: Duration = Duration::from_secs(1);
/// How often a read-only compute renews its lease.
pub const READ_ONLY_LEASE_RENEWAL: Duration = Duration::from_secs(60);
/// How often a replica's replay position is asked for: the read floor and
/// the lag follow it this closely.
pub const REPLICA_POLL: Duration = Duration::from_millis(200);
/// Bound on one poll's query of a replica.
pub const REPLICA_QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// A replica's moved floor is leased at most this often...
pub const REPLICA_LEASE_MOVE: Duration = Duration::from_secs(5);
/// ...and the lease renewed at least this often.
pub const REPLICA_LEASE_RENEW: Duration = Duration::from_secs(60);
/// WAL ends remembered for a replica's lag in seconds: at one per poll,
/// longer than the time bound's default.
pub const MAX_END_SAMPLES: usize = 8192;
/// How often an agent with `suspend_after_secs` counts its PostgreSQL's
/// clients: a suspension comes at most this long after the idle period.
pub const IDLE_POLL: Duration = Duration::from_secs(1);

/// How often the agent reads PostgreSQL's transaction and connection
/// counts for its metrics (the console's graphs sample every 10 s).
pub const ACTIVITY_POLL: Duration = Duration::from_secs(5);
/// Bound on one count of the clients (an answer that does not come counts
/// as not idle).
pub const IDLE_QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest idle period `suspend_after_secs` accepts (30 days): longer
/// would mean never, which is 0.
pub const MAX_SUSPEND_AFTER_SECS: u64 = 30 * 24 * 3600;
/// Bound on a checkpoint asked for over HTTP: PostgreSQL's spread
/// checkpoint is not used (`CHECKPOINT` is immediate), but a large one
/// writes every dirty buffer.
pub const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a primary's agent looks for free space map pages PostgreSQL
/// wrote and sends the changed ones (`docs/free-space-maps.md`).
pub const FSM_SYNC_EVERY: Duration = Duration::from_secs(15);
/// Pages read into memory by one pass (8 MiB); the rest waits for the next.
pub const FSM_PASS_MAX_PAGES: usize = 1024;
/// A map file modified this recently is read again at the next pass, as a
/// write in the same clock tick would not change its stamp.
pub const FSM_STAMP_SETTLE: Duration = Duration::from_secs(2);
/// Bound on one pass's sending, and on the checkpoint and pass before a
/// stop (a stop goes on without them).
pub const FSM_SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on a TLS handshake with the status server.
pub const STATUS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a pageserver's lease on an LSN lasts (the pageserver's
/// setting, not ours): renewals must come well within it.
const PAGESERVER_LEASE: Duration = Duration::from_secs(600);
/// PostgreSQL's default `wal_sender_timeout`: a standby silent this long is
/// dropped, so the proposer's reports must come well within it.
const WAL_SENDER_TIMEOUT: Duration = Duration::from_secs(60);
/// The safekeepers' default idle timeout (they close a silent connection).
const SAFEKEEPER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// `a < b`, usable in constants.
const fn shorter(a: Duration, b: Duration) -> bool {
    a.as_nanos() < b.as_nanos()
}

/// `a <= b`, usable in constants.
const fn at_most(a: Duration, b: Duration) -> bool {
    a.as_nanos() <= b.as_nanos()
}

// A full window of appends to one safekeeper fits its command queue (a
// full queue drops commands), and an append fits a safekeeper's frame.
const _: () = assert!(PROPOSER_MAX_APPEND_BYTES as u64 <= PROPOSER_MAX_IN_FLIGHT_BYTES);
const _: () =
    assert!(PROPOSER_MAX_IN_FLIGHT_BYTES.div_ceil(PROPOSER_MAX_APPEND_BYTES as u64) <= LINK_COMMANDS_CAPACITY as u64);
const _: () = assert!(PROPOSER_MAX_APPEND_BYTES < MAX_FRAME_SIZE);
const _: () = assert!(PROPOSER_MAX_APPEND_BYTES <= LINK_MAX_WRITE_BATCH);
// The buffer is trimmed only past half full: a window in flight to every
// safekeeper stays below that; what a donor gives fits a fetch.
const _: () = assert!(PROPOSER_MAX_IN_FLIGHT_BYTES <= PROPOSER_MAX_BUFFER_BYTES as u64 / 2);
const _: () = assert!(PROPOSER_MAX_BUFFER_BYTES <= MAX_WAL_FETCH_BYTES);
const _: () = assert!(LINK_COMMANDS_CAPACITY <= LINK_EVENTS_CAPACITY);
// Keepalives and retries come well within the timeouts they keep off.
const _: () = assert!(at_most(STATUS_REPORT_INTERVAL.saturating_mul(10), WAL_SENDER_TIMEOUT));
const _: () = assert!(shorter(COMMIT_UPDATE_DELAY, LAGGING_CHECK_INTERVAL));
const _: () = assert!(at_most(LAGGING_CHECK_INTERVAL.saturating_mul(10), POSITION_RETRY));
const _: () = assert!(shorter(PROPOSER_TIMEOUT, QUORUM_WAIT));
const _: () = assert!(shorter(SAFEKEEPER_IDLE_TIMEOUT, IDLE_READ_TIMEOUT));
const _: () = assert!(at_most(LINK_FIRST_BACKOFF, LINK_RECONNECT_MIN_BACKOFF));
const _: () = assert!(at_most(LINK_RECONNECT_MIN_BACKOFF, LINK_MAX_BACKOFF));
const _: () = assert!(shorter(LINK_MAX_BACKOFF, PROPOSER_TIMEOUT));
// PostgreSQL's message length is an Int32; the read buffer grows in
// chunks up to a message.
const _: () = assert!(MAX_MESSAGE_LEN <= i32::MAX as usize);
const _: () = assert!(READ_CHUNK <= SHRINK_ABOVE && SHRINK_ABOVE <= MAX_MESSAGE_LEN);
const _: () = assert!(shorter(PAGE_CONNECT_TIMEOUT, PAGE_RESPONSE_TIMEOUT));
const _: () = assert!(shorter(CONTROLLER_RETRY_PAUSE, READER_RETRY) && shorter(READER_RETRY, CONTROLLER_LONG_POLL));
// A prefetch window is one pipelined batch on one connection, and fits in
// the kernel's read-ahead; each daemon thread can have a connection.
const _: () = assert!(PREFETCH_MIN <= PREFETCH_MAX && PREFETCH_MAX as usize <= MAX_PIPELINE_DEPTH);
const _: () = assert!(PREFETCH_MAX as usize * BLCKSZ <= READ_AHEAD_KB as usize * 1024);
const _: () = assert!(PAGE_SOURCE_CONNECTIONS >= LAZY_FS_THREADS);
const _: () = assert!(at_most(LAZY_FETCH_FIRST_PAUSE, LAZY_FETCH_MAX_PAUSE));
const _: () = assert!(shorter(LAZY_FETCH_MAX_PAUSE, LAZY_FETCH_RETRY_FOR));
// The defaults are accepted by the configuration file's own bounds, and
// its largest cache is a byte count that fits.
const _: () = assert!(LAZY_FETCH_RETRY_FOR.as_secs() <= MAX_LAZY_FETCH_RETRY_SECS);
const _: () = assert!(MAX_LAZY_CACHE_MB <= u64::MAX >> 20);
const _: () = assert!(at_most(PAGESERVER_FIRST_BACKOFF, PAGESERVER_MAX_BACKOFF));
const _: () = assert!(at_most(PAGESERVER_CONNECT_TIMEOUT, PAGESERVER_REQUEST_TIMEOUT));
const _: () = assert!(at_most(INGEST_WAIT_FIRST_PAUSE, INGEST_WAIT_MAX_PAUSE));
const _: () = assert!(at_most(READY_FIRST_PAUSE, READY_MAX_PAUSE));
const _: () = assert!(shorter(PROCESS_EXIT_POLL, IMMEDIATE_STOP_TIMEOUT));
const _: () = assert!(shorter(PROCESS_EXIT_POLL, LEFTOVER_STEP_TIMEOUT));
const _: () = assert!(LOG_TAIL_BYTES <= LOG_REASON_BYTES);
const _: () = assert!(MAX_REASON_CHARS as u64 <= LOG_REASON_BYTES);
// Leases are renewed well before they lapse; a replica polls more often
// than it moves its lease, and remembers WAL ends for longer than its
// default bound on lag.
const _: () = assert!(at_most(READ_ONLY_LEASE_RENEWAL.saturating_mul(2), PAGESERVER_LEASE));
const _: () = assert!(at_most(REPLICA_LEASE_RENEW.saturating_mul(2), PAGESERVER_LEASE));
const _: () = assert!(shorter(REPLICA_POLL, REPLICA_LEASE_MOVE) && shorter(REPLICA_LEASE_MOVE, REPLICA_LEASE_RENEW));
const _: () = assert!(at_most(REPLICA_QUERY_TIMEOUT, REPLICA_LEASE_MOVE));
const _: () =
    assert!(REPLICA_POLL.as_millis() * MAX_END_SAMPLES as u128 >= DEFAULT_MAX_REPLICA_LAG_SECS as u128 * 1000);
// A busy server may answer a count later than the next one is due without
// it being given up (counts run one after another, never side by side);
// the longest idle period is far from overflowing an Instant.
const _: () = assert!(shorter(IDLE_POLL, IDLE_QUERY_TIMEOUT));
const _: () = assert!(MAX_SUSPEND_AFTER_SECS <= u32::MAX as u64);
