//! Prometheus metrics of the pageserver.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use strata_protocol::api::pageserver::LocationMode;
use strata_protocol::TenantShardId;

use crate::layer::files::CacheMetrics;

strata_service::declare_metrics! {
    /// Counters and histograms shared by every timeline and connection.
    pub struct Metrics in "strata_pageserver" {
        wal_bytes_ingested: Counter => "WAL bytes decoded and ingested",
        wal_stream_bytes: Counter => "Bytes of WAL streams received from safekeepers (raw WAL, or decoded batches compressed)",
        decoded_batches: Counter => "Batches of decoded WAL received",
        records_ingested: Counter => "WAL records ingested",
        layers_flushed: Counter => "In-memory layers written to layer files",
        layer_bytes_written: Counter => "Bytes of layer files written",
        fresh_bytes_written: Counter => "Bytes of fresh-page deltas written by flushes (pages that started from a base in their flush; compaction leaves them as they are)",
        getpage_requests: Counter => "GetPage requests served",
        getpage_batches: Counter => "Batched lookups serving GetPage requests",
        getpage_batch_size: Histogram = Histogram::new(exponential_buckets(1.0, 2.0, 8)) => "GetPage requests per batched lookup",
        read_layers_visited: Histogram = Histogram::new(exponential_buckets(1.0, 2.0, 12)) => "Layers (in memory and files) a read of one key searched until it had every version it needed",
        request_seconds: Histogram = Histogram::new(exponential_buckets(0.00001, 2.0, 20)) => "Page service request latency",
        request_errors: Counter => "Page service requests answered with an error",
        page_connections: Gauge => "Open page service connections",
        page_connections_refused: Family<PageRefusal, Counter> => "Page service connections refused after their hello was accepted, by reason (tenant_limit: the hello's tenant already held max_connections_per_tenant)",
        page_tenants_connected: Gauge => "Tenants with at least one open page service connection",
        page_tenants_at_limit: Gauge => "Tenants holding max_connections_per_tenant page service connections (their next one is refused)",
        basebackups: Counter => "Basebackups served",
        walreceiver_connects: Counter => "Connections made to safekeepers",
        wal_segments_from_object_storage: Counter => "WAL segments read from object storage because the safekeepers had removed them",
        timelines_broken: Gauge => "Timelines stopped by an error (see their status)",
        timelines: Family<TimelineActivity, Gauge> => "Timelines attached here, by state: active (WAL receiver and flusher threads running) or idle (no thread, no WAL stream)",
        timelines_gone_idle: Counter => "Times a timeline went idle (no WAL for idle_after: its WAL stream and threads ended)",
        timeline_wakes: Family<WakeReason, Counter> => "Times an idle timeline was woken, by reason (wal: a safekeeper had WAL it lacked; read: a read waited for an LSN)",
        heap_trims: Counter => "Times the allocator's free memory was returned to the system after timelines went idle",
        positions_errors: Counter => "Reads of a safekeeper's positions (GET /v1/positions) that failed",
        timeline_reloads: Counter => "Broken timelines re-read from disk",
        redo_records_stored: Counter => "Block changes stored as WAL records for native redo (no image)",
        redo_pages_materialized: Counter => "Pages written as images by ingest to keep redo chains short",
        redo_records_applied: Counter => "Stored changes applied to rebuild pages that were read",
        rebuilt_page_hits: Counter => "Page reads that started from a page rebuilt by an earlier read",
        redo_blocks_verified: Counter => "Blocks whose native redo was compared with PostgreSQL's image (verify_redo)",
        redo_mismatches: Counter => "Blocks whose native redo differed from PostgreSQL's image (verify_redo)",
        fsm_pages_stored: Counter => "Free space map pages stored from computes' messages (docs/free-space-maps.md)",
        fsm_pages_refused: Counter => "Free space map pages (or whole messages) skipped because they did not hold",
        layer_files_open: Gauge => "Layer files open in the descriptor cache",
        layer_file_opens: Counter => "Layer files opened by the descriptor cache",
        layer_file_evictions: Counter => "Layer files closed to stay within max_open_layer_files",
        compactions: Counter => "L0 compactions finished",
        compaction_bytes_read: Counter => "Stored bytes of L0 deltas read by compaction",
        compaction_bytes_written: Counter => "Bytes of L1 delta files written by compaction",
        image_layers_created: Counter => "Image layer files written",
        image_bytes_written: Counter => "Bytes of image layer files written",
        compaction_errors: Counter => "Compactions and image creations that failed (retried later)",
        l0_layers: Gauge => "L0 delta layers of all timelines",
        l1_layers: Gauge => "L1 delta layers of all timelines",
        image_layers: Gauge => "Image layers of all timelines",
        backpressure_timelines: Gauge => "Timelines whose ingest is slowed because L0 deltas wait for compaction",
        gc_layers_removed: Counter => "Layer files removed by garbage collection",
        gc_bytes_removed: Counter => "Bytes of layer files removed by garbage collection",
        layers_uploaded: Counter => "Layer files uploaded to remote storage",
        upload_bytes: Counter => "Bytes of layer files uploaded",
        indexes_uploaded: Counter => "Index manifests uploaded",
        upload_errors: Counter => "Uploads to remote storage that failed (retried with backoff)",
        upload_lag_bytes: Gauge => "Bytes of layer files of all timelines not yet in remote storage",
        upload_queue_layers: Gauge => "Layer files of all timelines waiting to be uploaded",
        layers_downloaded: Counter => "Layer files downloaded on demand",
        download_bytes: Counter => "Bytes of layer files downloaded",
        download_errors: Counter => "On-demand downloads that failed",
        layers_evicted: Counter => "Layer files evicted from local disk (kept in remote storage)",
        local_layer_bytes: Gauge => "Bytes of layer files on local disk, all timelines",
        layer_index_bytes: Gauge => "Bytes of memory layers keep of their files (index summaries, key filters), all timelines; at most layer_index_cache_bytes after each round",
        layer_index_reloads: Counter => "Times a read loaded a layer's dropped in-memory index again from its local file",
        layer_index_unloads: Counter => "Times a layer dropped its in-memory index to stay within layer_index_cache_bytes (its next read opens the file again)",
        remote_deletions: Counter => "Objects deleted from remote storage through the deletion queue",
        remote_deletions_refused: Counter => "Queued deletions dropped because their generation is no longer current",
        reader_reloads: Counter => "Reader locations loaded again: a layer they had not downloaded was gone from the newest index",
        upload_backpressure_timelines: Gauge => "Timelines whose ingest is slowed because uploads lag more than max_upload_lag_bytes",
        tenants: Family<TenantMode, Gauge> => "Tenants held here, by location mode (attached, secondary, reader)",
        tenant_local_layer_bytes: Family<TenantLabel, Gauge> => "Bytes of a tenant's layer files on local disk (a secondary's: its warm cache)",
        tenant_remote_layer_bytes: Family<TenantLabel, Gauge> => "Bytes of a tenant's layer files in object storage, as the indexes of its timelines loaded here list them",
    }
}

/// Whether a timeline streams WAL: a fixed set, one series each.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimelineActivity {
    /// `active` or `idle`.
    pub state: &'static str,
}

/// Why an idle timeline was woken: a fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WakeReason {
    /// `wal` or `read`.
    pub reason: &'static str,
}

impl Metrics {
    /// Sets the gauge of timelines by state.
    pub fn set_timeline_activity(&self, active: usize, idle: usize) {
        for (state, n) in [("active", active), ("idle", idle)] {
            self.timelines.get_or_create(&TimelineActivity { state }).set(gauge_value(n as u64));
        }
    }

    /// Counts a wake of an idle timeline.
    pub fn count_wake(&self, reason: &'static str) {
        self.timeline_wakes.get_or_create(&WakeReason { reason }).inc();
    }
}

/// Why a page service connection was refused after its hello. A fixed set
/// of reasons: never a tenant or any other value a client chooses.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PageRefusal {
    pub reason: &'static str,
}

impl PageRefusal {
    /// The hello's tenant already held `max_connections_per_tenant` connections.
    pub const TENANT_LIMIT: PageRefusal = PageRefusal { reason: "tenant_limit" };
}

/// The series of one tenant. Its id is not a value a client chooses (the
/// tenant a page service hello names gets no series): only tenants this
/// pageserver holds get one, and a tenant is only created or placed here
/// through the management API, by the operator's control plane or the
/// storage controller. These families are refilled from the live state at
/// every scrape ([`Metrics::set_tenants`]), so their size is bounded by the
/// tenants held here and a tenant that leaves takes its series with it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// The tenant id in hex.
    pub tenant: String,
}

/// A location mode: a fixed set, one series each.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantMode {
    /// `attached`, `secondary` or `reader`.
    pub mode: &'static str,
}

/// The modes `tenants` counts; a detached tenant is held nowhere.
const MODES: [(LocationMode, &str); 3] =
    [(LocationMode::Attached, "attached"), (LocationMode::Secondary, "secondary"), (LocationMode::Reader, "reader")];

/// What the metrics show of one tenant held here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSizes {
    pub tenant: TenantShardId,
    /// How it is held here (never detached).
    pub mode: LocationMode,
    /// Its layer files on local disk.
    pub local_layer_bytes: u64,
    /// Its layers in object storage, as its loaded timelines' indexes list
    /// them; none where it has no timeline with object storage here (a
    /// secondary, or a pageserver without object storage).
    pub remote_layer_bytes: Option<u64>,
}

impl Metrics {
    /// Replaces every per-tenant series with those of `tenants`, the
    /// tenants held here now. Cleared first: a tenant that is gone has no
    /// series left, rather than its last values forever.
    pub fn set_tenants(&self, tenants: &[TenantSizes]) {
        self.tenant_local_layer_bytes.clear();
        self.tenant_remote_layer_bytes.clear();
        for t in tenants {
            let label = TenantLabel { tenant: t.tenant.to_string() };
            self.tenant_local_layer_bytes.get_or_create(&label).set(gauge_value(t.local_layer_bytes));
            if let Some(bytes) = t.remote_layer_bytes {
                self.tenant_remote_layer_bytes.get_or_create(&label).set(gauge_value(bytes));
            }
        }
        for (mode, name) in MODES {
            let n = tenants.iter().filter(|t| t.mode == mode).count();
            self.tenants.get_or_create(&TenantMode { mode: name }).set(gauge_value(n as u64));
        }
    }

    /// The descriptor cache's counters (shared with these).
    pub fn layer_files(&self) -> CacheMetrics {
        CacheMetrics {
            open: self.layer_files_open.clone(),
            opens: self.layer_file_opens.clone(),
            evictions: self.layer_file_evictions.clone(),
            index_reloads: self.layer_index_reloads.clone(),
        }
    }
}

/// A byte count as a gauge's value (an `i64`; no disk holds more).
fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
