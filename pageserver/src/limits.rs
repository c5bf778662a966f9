//! Every bound of the pageserver: what grows with load or time and where it
//! stops (queues and channels, caches, batches, the largest documents
//! accepted, timeouts, retries and the periods of background work, and the
//! configuration's defaults and accepted ranges for the same). Format
//! constants (tags, versions, magic numbers, field sizes of the layer file
//! format) stay with their formats.
//!
//! The relations between them are checked when the crate compiles (the
//! `const _` items at the end), so that changing one bound cannot quietly
//! break another.

use std::time::Duration;

use strata_formats::version::BLCKSZ;
use strata_protocol::pageserver::codec::MAX_FRAME_SIZE as PAGE_MAX_FRAME_SIZE;
use strata_protocol::pageserver::MAX_PIPELINE_DEPTH;

// WAL receiver (`walreceiver.rs`).

/// Longest a connection to a safekeeper, and its first answer, may take.
pub const WAL_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Safekeepers send a keepalive every few seconds; silence longer than this is a dead link.
pub const WAL_READ_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest one read of a stream waits: the loop around it sends feedback,
/// probes the other safekeepers and checks for silence and shutdown on its
/// own clock, also while the safekeeper sends nothing.
pub const WAL_POLL: Duration = Duration::from_millis(200);
/// How often the applied and uploaded LSNs are reported to the safekeeper.
pub const WAL_FEEDBACK_INTERVAL: Duration = Duration::from_secs(1);
/// First wait before reconnecting after a failed stream; doubles on each failure.
pub const WAL_MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait before reconnecting.
pub const WAL_MAX_BACKOFF: Duration = Duration::from_secs(5);
/// After this long with nothing more to ingest from the current safekeeper,
/// ask the others whether they have committed more (the current one may lag:
/// a quorum does not need it).
pub const WAL_PROBE_AFTER: Duration = Duration::from_secs(2);
/// How long the current safekeeper may still deliver what another one was
/// found to have committed, before the receiver switches: a commit that
/// arrives just as the probe looks reaches both at about the same time.
pub const WAL_BEHIND_GRACE: Duration = Duration::from_secs(1);
/// How far behind another site's safekeeper an own-site one may be and
/// still be streamed from: WAL crosses the link between sites once (to the
/// own site's safekeepers), not twice.
pub const SITE_SLACK: u64 = 16 << 20;
/// While streaming from another site, how often an own-site safekeeper is
/// asked whether it has caught up.
pub const SITE_RETURN_PROBE: Duration = Duration::from_secs(5);
/// How often a broken timeline's receiver looks whether it was re-read.
pub const BROKEN_RECEIVER_POLL: Duration = Duration::from_millis(500);
/// How often the flusher of a timeline looks for frozen layers.
pub const FLUSH_POLL: Duration = Duration::from_millis(100);

// Idle timelines (`idle.rs`, `watcher.rs`).

/// Longest one read of a safekeeper's positions may take (connect and answer).
pub const POSITIONS_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest answer of positions accepted (some 300 bytes per timeline: about
/// 200,000 timelines).
pub const POSITIONS_MAX_ANSWER: u64 = 64 << 20;
/// Shortest time between two returns of the allocator's free memory to
/// the system after timelines went idle (`heap_trim.rs`): one walk of
/// every arena serves all that went idle meanwhile.
pub const HEAP_TRIM_MIN_INTERVAL: Duration = Duration::from_secs(5);

// Ingest (`ingest.rs`) and in-memory layers (`timeline.rs`).

/// An in-memory layer older than this is frozen even if small, so that
/// `disk_consistent_lsn` (and re-ingest after a crash) stays close behind.
pub const MAX_LAYER_AGE: Duration = Duration::from_secs(30);
/// Frozen layers allowed to wait for their flush before ingest waits too.
pub const MAX_FROZEN: usize = 2;
/// How often a freeze waiting for flushes looks whether the timeline broke.
pub const FROZEN_WAIT_POLL: Duration = Duration::from_millis(200);
/// Most WAL records a read of a page redoes: the next record of that page
/// is redone at ingest and stored as an image.
pub const MAX_REDO_CHAIN: u32 = 128;
/// Most bytes of records stored for a page since its last image: the record
/// that would pass it is redone at ingest and stored as an image instead.
/// Two pages: an image then costs at most half of what the records it
/// replaces cost, and a page filled row by row (a bulk insert: one record
/// per row) is stored as its records alone (`docs/pageserver.md`, "Chains
/// stay short").
pub const MAX_CHAIN_BYTES: usize = 16384;
/// Pages whose chain length ingest tracks; beyond this the counts start over
/// (chains may then reach twice the limit, never more).
pub const MAX_TRACKED_CHAINS: usize = 100_000;
/// Versions of ingested records held back before they are made visible
/// together (a network message's worth usually): one lock and one
/// wake-up of LSN waiters per batch instead of per record.
pub const MAX_PENDING_VERSIONS: usize = 4096;
/// Versions committed per batch while importing (bounds memory).
pub const IMPORT_BATCH: usize = 1024;
/// Default of `import_max_bytes`: the file data one import may send.
pub const DEFAULT_IMPORT_MAX_BYTES: u64 = 1 << 40;
/// Imports receiving at once (each holds a copy of a database on disk).
pub const IMPORTS_AT_ONCE: usize = 2;
/// The longest wait for the next bytes of an import's upload.
pub const IMPORT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

// Reads (`rebuilt_pages.rs`, `layer/layer_file`).

/// Rebuilt pages kept per timeline (8 KiB each: 8 MiB).
pub const REBUILT_PAGES: usize = 1024;
/// Groups each thread keeps decompressed.
pub const RECENT_GROUPS: usize = 8;
/// Index blocks each thread keeps decoded (128 entries each).
pub const RECENT_INDEX_BLOCKS: usize = 16;
/// Bytes a layer scan reads at a time (more when one value is larger).
pub const SCAN_READ_AHEAD: u64 = 256 << 10;

// Leases and GC (`timeline/leases.rs`, `background.rs`).

/// How long a lease lasts unless renewed.
pub const LEASE_TTL: Duration = Duration::from_secs(600);
/// How often computes and replicas renew their leases (their agents'
/// period): a lease outlives a missed renewal.
pub const LEASE_RENEWAL: Duration = Duration::from_secs(60);
/// Most named holders per timeline: each is a replica, and a name that is
/// not renewed goes after [`LEASE_TTL`].
pub const MAX_HOLDERS: usize = 1024;
/// Longest holder name accepted.
pub const MAX_HOLDER_LEN: usize = 128;

// Compaction (`timeline/compaction.rs`, `background.rs`).

/// Most L0 deltas one compaction merges (bounds its duration; the rest wait for the next).
pub const MAX_L0_PER_COMPACTION: usize = 64;
/// Keys reconstructed per batch when writing images.
pub const IMAGE_BATCH: usize = 256;
/// Bytes compaction reads between two looks at the clock of its throttle
/// (a clock read costs more than a small value's copy).
pub const THROTTLE_CHECK_BYTES: u64 = 64 << 10;
/// How far ahead of its rate compaction may run before it sleeps.
pub const THROTTLE_SLACK: Duration = Duration::from_millis(10);
/// Longest the compactor sleeps between two looks at its stop flag.
pub const COMPACTOR_STOP_POLL: Duration = Duration::from_millis(100);

// Tenants (`tenants.rs`, `tenants/readers.rs`, `lib.rs`).

/// How often broken timelines are considered for re-reading.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Broken timelines whose cause may pass are re-read from disk this often at first.
pub const RELOAD_MIN_DELAY: Duration = Duration::from_secs(1);
/// ... and at least this often, however often re-reading failed.
pub const RELOAD_MAX_DELAY: Duration = Duration::from_secs(60);
/// Longest a shutdown waits for the last uploads.
pub const SHUTDOWN_UPLOAD_WAIT: Duration = Duration::from_secs(10);
/// How often reader locations look for new timelines and download layers.
pub const READER_REFRESH_INTERVAL: Duration = Duration::from_secs(2);
/// Most layers one refresh round downloads per tenant: a large tenant is
/// made resident over several rounds, and deletions are noticed between.
pub const DOWNLOADS_PER_ROUND: usize = 64;

// Object storage (`remote/`, `secondary.rs`).

/// Layer uploads in flight at once, per pageserver.
pub const MAX_UPLOADS_IN_FLIGHT: usize = 4;
/// Deletion batches that may wait; the upload loop waits when it is full.
pub const DELETION_QUEUE: usize = 256;
/// Most deletion batches validated against one read of the attachment file.
pub const DELETION_BATCHES_PER_CHECK: usize = 64;
/// Threads of the transfer runtime.
pub const TRANSFER_THREADS: usize = 2;
/// The upload loop looks at the metadata at least this often without being woken.
pub const UPLOAD_SYNC_PERIOD: Duration = Duration::from_secs(10);

/// How long a split waits for each parent timeline's upload before the
/// step fails (the storage controller calls it again).
pub const SPLIT_UPLOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// Backoff between failed upload rounds: from this, doubling, ...
pub const UPLOAD_RETRY_MIN: Duration = Duration::from_millis(100);
/// ... up to this, forever.
pub const UPLOAD_RETRY_MAX: Duration = Duration::from_secs(30);
/// Largest remote index accepted (about a million layers).
pub const MAX_INDEX_BYTES: usize = 256 << 20;
/// Largest attachment file accepted.
pub const MAX_ATTACHMENTS_BYTES: u64 = 16 << 20;
/// Largest heatmap accepted.
pub const MAX_HEATMAP_BYTES: usize = 64 << 20;

// Page service and HTTP (`page_service.rs`, `http.rs`).

/// An idle page service connection is closed after this long.
pub const PAGE_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest one answer of the page service may take to be written.
pub const PAGE_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a branch at an LSN waits for the parent to ingest it.
pub const BRANCH_LSN_WAIT: Duration = Duration::from_secs(30);
/// Bytes of a basebackup sent to the HTTP body at a time.
pub const BASEBACKUP_CHUNK: usize = 256 << 10;
/// Pages fetched per lookup while a basebackup streams relation data.
pub const BASEBACKUP_READ_BATCH: usize = 64;

// The configuration's defaults (`config.rs`) and the ranges it accepts
// (inclusive), where a value outside would break the service.

/// WAL bytes ingested into the in-memory layer before it is frozen.
pub const DEFAULT_CHECKPOINT_DISTANCE: u64 = 64 << 20;
/// Accepted `checkpoint_distance`.
pub const CHECKPOINT_DISTANCE_RANGE: (u64, u64) = (1 << 20, 1 << 30);
/// Longest a request waits for WAL up to its LSN to be ingested.
pub const DEFAULT_WAIT_LSN_TIMEOUT: Duration = Duration::from_secs(30);
/// A timeline that receives no WAL for this long goes idle.
pub const DEFAULT_IDLE_AFTER: Duration = Duration::from_secs(30);
/// Shortest accepted `idle_after` (other than 0, never).
pub const MIN_IDLE_AFTER: Duration = Duration::from_secs(1);
/// How often the safekeepers' positions are read while a timeline idles.
pub const DEFAULT_IDLE_POLL_PERIOD: Duration = Duration::from_secs(1);
/// Most page service connections at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Most connections on the HTTP listener at once.
pub const DEFAULT_MAX_HTTP_CONNECTIONS: usize = 64;
/// Accepted `max_connections` and `max_http_connections`.
pub const CONNECTIONS_RANGE: (usize, usize) = (1, 100_000);
/// Unless configured, one tenant may hold this fraction (1/N) of the page
/// service's `max_connections`: four tenants at their limit still leave
/// room for a fifth.
pub const TENANT_SHARE_OF_CONNECTIONS: usize = 4;
/// ... but at least this many (a lazy compute alone opens several), unless
/// `max_connections` itself is smaller.
pub const MIN_DEFAULT_CONNECTIONS_PER_TENANT: usize = 4;
/// The default `max_connections_per_tenant` for the default `max_connections`.
pub const DEFAULT_MAX_CONNECTIONS_PER_TENANT: usize = default_connections_per_tenant(DEFAULT_MAX_CONNECTIONS);
/// Longest a new connection may take to send its hello.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most layer files open at once.
pub const DEFAULT_MAX_OPEN_LAYER_FILES: usize = 256;
/// Accepted `max_open_layer_files` (a read holds one descriptor per layer it visits).
pub const OPEN_LAYER_FILES_RANGE: (usize, usize) = (16, 1_000_000);
/// Descriptors kept for everything but client connections and layer
/// files: WAL receiver sockets, metadata writes, flushes, initdb, logs.
pub const RESERVED_FILES: usize = 192;
/// initdb templates kept in one directory (one per PostgreSQL install
/// seen; older installs' go first).
pub const INITDB_TEMPLATES_KEPT: usize = 3;
/// Age after which an unfinished template build is taken as abandoned (a
/// build takes seconds).
pub const INITDB_TEMPLATE_TMP_AGE: Duration = Duration::from_secs(3600);
/// L0 deltas that start a compaction.
pub const DEFAULT_COMPACTION_THRESHOLD: usize = 10;
/// Accepted `compaction_threshold`.
pub const COMPACTION_THRESHOLD_RANGE: (usize, usize) = (2, 1000);
/// Size at which compaction and image creation start a new file.
pub const DEFAULT_COMPACTION_TARGET_SIZE: u64 = 128 << 20;
/// Accepted `compaction_target_size`.
pub const COMPACTION_TARGET_SIZE_RANGE: (u64, u64) = (64 << 10, 16 << 30);
/// Bytes of fresh pages of one relation fork in one flush from which they
/// are written as their own deltas (`docs/pageserver.md`, "Fresh pages
/// skip compaction"): a file per fork, so below this they would make
/// small files.
pub const DEFAULT_FRESH_PAGE_MIN_BYTES: u64 = 1 << 20;
/// L1 delta runs above the newest image that start an image creation.
pub const DEFAULT_IMAGE_CREATION_THRESHOLD: usize = 3;
/// Accepted `image_creation_threshold`.
pub const IMAGE_CREATION_THRESHOLD_RANGE: (usize, usize) = (1, 1000);
/// L0 deltas at which ingest is slowed.
pub const DEFAULT_L0_BACKPRESSURE_THRESHOLD: usize = 30;
/// Largest accepted `l0_backpressure_threshold` (the smallest is `compaction_threshold`).
pub const MAX_L0_BACKPRESSURE_THRESHOLD: usize = 10_000;
/// Bytes per second compaction and image creation may read.
pub const DEFAULT_COMPACTION_MAX_BYTES_PER_SECOND: u64 = 256 << 20;
/// How often each timeline is checked for compaction and image creation.
pub const DEFAULT_COMPACTION_PERIOD: Duration = Duration::from_secs(1);
/// History kept readable by commit time.
pub const DEFAULT_PITR_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);
/// History kept readable by bytes of WAL.
pub const DEFAULT_GC_HORIZON: u64 = 64 << 20;
/// How often each timeline is garbage collected.
pub const DEFAULT_GC_PERIOD: Duration = Duration::from_secs(60);
/// Warm layer bytes the secondary locations of a pageserver hold together.
pub const DEFAULT_SECONDARY_CACHE_BYTES: u64 = 8 << 30;
/// How often heatmaps are published and read.
pub const DEFAULT_HEATMAP_PERIOD: Duration = Duration::from_secs(5);
/// Memory layers keep of their files (index summaries, key filters), all
/// timelines: about 0.4% of the layer bytes read, so 128 MiB keeps some
/// 30 GB of layers ready for reads without opening them again.
pub const DEFAULT_LAYER_INDEX_CACHE_BYTES: u64 = 128 << 20;
/// Smallest accepted `layer_index_cache_bytes`.
pub const MIN_LAYER_INDEX_CACHE_BYTES: u64 = 64 << 10;
/// Bytes of layer files not yet in object storage above which ingest is slowed.
pub const DEFAULT_MAX_UPLOAD_LAG_BYTES: u64 = 1 << 30;
/// Smallest accepted `max_upload_lag_bytes`.
pub const MIN_UPLOAD_LAG_BYTES: u64 = 1 << 20;
/// A replica's lease further behind the ingested WAL is refused.
pub const DEFAULT_MAX_REPLICA_LAG_BYTES: u64 = 1 << 30;

// WAL receiver: the link is declared dead only after several polls, and
// feedback and probes happen well within it; connecting takes less than that.
const _: () = assert!(WAL_POLL.as_nanos() < WAL_FEEDBACK_INTERVAL.as_nanos());
const _: () = assert!(WAL_FEEDBACK_INTERVAL.as_nanos() < WAL_READ_TIMEOUT.as_nanos());
const _: () = assert!(WAL_CONNECT_TIMEOUT.as_nanos() < WAL_READ_TIMEOUT.as_nanos());
// A lagging safekeeper is found and left before it would be dropped as silent.
const _: () = assert!(WAL_POLL.as_nanos() <= WAL_BEHIND_GRACE.as_nanos());
const _: () = assert!(WAL_BEHIND_GRACE.as_nanos() + WAL_PROBE_AFTER.as_nanos() < WAL_READ_TIMEOUT.as_nanos());
const _: () = assert!(!WAL_MIN_BACKOFF.is_zero() && WAL_MIN_BACKOFF.as_nanos() <= WAL_MAX_BACKOFF.as_nanos());
// A small layer is frozen by age: the receiver looks at its age every poll.
const _: () = assert!(WAL_POLL.as_nanos() < MAX_LAYER_AGE.as_nanos());
const _: () = assert!(MAX_FROZEN >= 1);
// A timeline goes idle only after it told the safekeepers what is durable:
// feedback goes out within the shortest idle period, and the receiver looks
// at its idleness every poll.
const _: () = assert!(WAL_FEEDBACK_INTERVAL.as_nanos() <= MIN_IDLE_AFTER.as_nanos());
const _: () = assert!(WAL_POLL.as_nanos() < MIN_IDLE_AFTER.as_nanos());
const _: () = assert!(MIN_IDLE_AFTER.as_nanos() <= DEFAULT_IDLE_AFTER.as_nanos());
// WAL arriving for an idle timeline is noticed well before a read that
// waits for it would give up (a read wakes its timeline at once anyway).
const _: () = assert!(DEFAULT_IDLE_POLL_PERIOD.as_nanos() < DEFAULT_WAIT_LSN_TIMEOUT.as_nanos());
const _: () = assert!(!DEFAULT_IDLE_POLL_PERIOD.is_zero() && !POSITIONS_TIMEOUT.is_zero());
// A timeline's memory goes back to the system soon after it idles: well
// within one more idle period, and no more often than the watcher looks.
const _: () = assert!(HEAP_TRIM_MIN_INTERVAL.as_nanos() < DEFAULT_IDLE_AFTER.as_nanos());
const _: () = assert!(HEAP_TRIM_MIN_INTERVAL.as_nanos() >= DEFAULT_IDLE_POLL_PERIOD.as_nanos());
const _: () = assert!(POSITIONS_MAX_ANSWER <= usize::MAX as u64);
// A stored chain holds at least one whole page of records: two, so that the
// image that ends it costs at most half of what it replaces.
const _: () = assert!(MAX_CHAIN_BYTES == 2 * BLCKSZ);
const _: () = assert!(MAX_REDO_CHAIN >= 2 && MAX_PENDING_VERSIONS >= 1 && MAX_TRACKED_CHAINS >= 1);
// The rebuilt-page cache is the 8 MiB its documentation says, and holds a
// whole batch of a basebackup, of image creation or of a page-service
// pipeline: a batch does not evict the pages it rebuilt itself.
const _: () = assert!(REBUILT_PAGES * BLCKSZ == 8 << 20);
const _: () = assert!(BASEBACKUP_READ_BATCH <= REBUILT_PAGES && IMAGE_BATCH <= REBUILT_PAGES);
const _: () = assert!(MAX_PIPELINE_DEPTH <= REBUILT_PAGES);
// A page answer fits one page-service frame.
const _: () = assert!(BLCKSZ + 64 <= PAGE_MAX_FRAME_SIZE);
const _: () = assert!(RECENT_GROUPS >= 1 && RECENT_INDEX_BLOCKS >= 1 && SCAN_READ_AHEAD >= BLCKSZ as u64);
// Leases survive a missed renewal, and GC after a restart waits one TTL.
const _: () = assert!(LEASE_TTL.as_secs() >= 2 * LEASE_RENEWAL.as_secs());
const _: () = assert!(MAX_HOLDERS >= 1 && MAX_HOLDER_LEN >= 1);
const _: () = assert!(MAX_L0_PER_COMPACTION >= COMPACTION_THRESHOLD_RANGE.0);
const _: () = assert!(THROTTLE_CHECK_BYTES.is_power_of_two());
// Re-reading is considered at least as often as its shortest delay.
const _: () = assert!(RELOAD_CHECK_INTERVAL.as_nanos() <= RELOAD_MIN_DELAY.as_nanos());
const _: () = assert!(RELOAD_MIN_DELAY.as_nanos() <= RELOAD_MAX_DELAY.as_nanos());
const _: () = assert!(!UPLOAD_RETRY_MIN.is_zero() && UPLOAD_RETRY_MIN.as_nanos() <= UPLOAD_RETRY_MAX.as_nanos());
// A failed upload round is retried before the loop would have looked anyway.
const _: () = assert!(UPLOAD_RETRY_MIN.as_nanos() < UPLOAD_SYNC_PERIOD.as_nanos());
// Tokio refuses a channel, a semaphore's work or a runtime of size zero.
const _: () = assert!(DELETION_QUEUE >= 1 && MAX_UPLOADS_IN_FLIGHT >= 1 && TRANSFER_THREADS >= 1);
const _: () = assert!(DELETION_BATCHES_PER_CHECK >= 1 && DOWNLOADS_PER_ROUND >= 1);
// Documents read whole into memory: their limits fit in memory's sizes.
const _: () = assert!(MAX_ATTACHMENTS_BYTES <= usize::MAX as u64);
const _: () = assert!(BASEBACKUP_CHUNK >= BLCKSZ && IMPORT_BATCH >= 1);
// Every default is one the configuration accepts.
const _: () = assert!(
    CHECKPOINT_DISTANCE_RANGE.0 <= DEFAULT_CHECKPOINT_DISTANCE
        && DEFAULT_CHECKPOINT_DISTANCE <= CHECKPOINT_DISTANCE_RANGE.1
);
const _: () = assert!(CONNECTIONS_RANGE.0 <= DEFAULT_MAX_CONNECTIONS && DEFAULT_MAX_CONNECTIONS <= CONNECTIONS_RANGE.1);
const _: () =
    assert!(CONNECTIONS_RANGE.0 <= DEFAULT_MAX_HTTP_CONNECTIONS && DEFAULT_MAX_HTTP_CONNECTIONS <= CONNECTIONS_RANGE.1);
const _: () = assert!(
    OPEN_LAYER_FILES_RANGE.0 <= DEFAULT_MAX_OPEN_LAYER_FILES
        && DEFAULT_MAX_OPEN_LAYER_FILES <= OPEN_LAYER_FILES_RANGE.1
);
// The descriptor cache refuses a capacity of zero.
const _: () = assert!(OPEN_LAYER_FILES_RANGE.0 >= 1);
const _: () = assert!(
    COMPACTION_THRESHOLD_RANGE.0 <= DEFAULT_COMPACTION_THRESHOLD
        && DEFAULT_COMPACTION_THRESHOLD <= COMPACTION_THRESHOLD_RANGE.1
);
const _: () = assert!(
    COMPACTION_TARGET_SIZE_RANGE.0 <= DEFAULT_COMPACTION_TARGET_SIZE
        && DEFAULT_COMPACTION_TARGET_SIZE <= COMPACTION_TARGET_SIZE_RANGE.1
);
const _: () = assert!(
    IMAGE_CREATION_THRESHOLD_RANGE.0 <= DEFAULT_IMAGE_CREATION_THRESHOLD
        && DEFAULT_IMAGE_CREATION_THRESHOLD <= IMAGE_CREATION_THRESHOLD_RANGE.1
);
const _: () = assert!(
    DEFAULT_COMPACTION_THRESHOLD <= DEFAULT_L0_BACKPRESSURE_THRESHOLD
        && DEFAULT_L0_BACKPRESSURE_THRESHOLD <= MAX_L0_BACKPRESSURE_THRESHOLD
);
const _: () = assert!(MIN_UPLOAD_LAG_BYTES <= DEFAULT_MAX_UPLOAD_LAG_BYTES);
const _: () = assert!(!DEFAULT_WAIT_LSN_TIMEOUT.is_zero() && !DEFAULT_HANDSHAKE_TIMEOUT.is_zero());
const _: () = assert!(!DEFAULT_COMPACTION_PERIOD.is_zero() && !DEFAULT_GC_PERIOD.is_zero());
const _: () = assert!(!DEFAULT_HEATMAP_PERIOD.is_zero());
// The template in use is always kept.
const _: () = assert!(INITDB_TEMPLATES_KEPT >= 1);
// The default share of a tenant is a real limit that still admits a tenant's
// usual clients, and one the configuration accepts.
const _: () = assert!(TENANT_SHARE_OF_CONNECTIONS >= 2 && MIN_DEFAULT_CONNECTIONS_PER_TENANT >= 1);
const _: () = assert!(
    CONNECTIONS_RANGE.0 <= DEFAULT_MAX_CONNECTIONS_PER_TENANT
        && MIN_DEFAULT_CONNECTIONS_PER_TENANT <= DEFAULT_MAX_CONNECTIONS_PER_TENANT
        && DEFAULT_MAX_CONNECTIONS_PER_TENANT < DEFAULT_MAX_CONNECTIONS
);
const _: () = assert!(default_connections_per_tenant(CONNECTIONS_RANGE.0) >= CONNECTIONS_RANGE.0);

/// The page service connections one tenant may hold when
/// `max_connections_per_tenant` is not configured: a share of
/// `max_connections`, at least a few, never more than `max_connections`.
pub const fn default_connections_per_tenant(max_connections: usize) -> usize {
    let share = max_connections / TENANT_SHARE_OF_CONNECTIONS;
    let floor = if MIN_DEFAULT_CONNECTIONS_PER_TENANT < max_connections {
        MIN_DEFAULT_CONNECTIONS_PER_TENANT
    } else {
        max_connections
    };
    if share > floor {
        share
    } else {
        floor
    }
}
