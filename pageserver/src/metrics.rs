//! Prometheus metrics of the pageserver.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use strata_service::ListenerMetrics;

use crate::layer::files::CacheMetrics;

/// Counters and histograms shared by every timeline and connection.
pub struct Metrics {
    registry: Registry,
    pub wal_bytes_ingested: Counter,
    pub records_ingested: Counter,
    pub layers_flushed: Counter,
    pub layer_bytes_written: Counter,
    pub getpage_requests: Counter,
    pub getpage_batches: Counter,
    pub getpage_batch_size: Histogram,
    pub read_layers_visited: Histogram,
    pub request_seconds: Histogram,
    pub request_errors: Counter,
    pub page_connections: Gauge,
    pub basebackups: Counter,
    pub walreceiver_connects: Counter,
    /// WAL segments read from the safekeepers' offloaded WAL (they had removed them).
    pub wal_segments_from_object_storage: Counter,
    pub timelines_broken: Gauge,
    pub timeline_reloads: Counter,
    pub redo_records_stored: Counter,
    pub redo_pages_materialized: Counter,
    pub redo_records_applied: Counter,
    pub rebuilt_page_hits: Counter,
    pub redo_blocks_verified: Counter,
    pub redo_mismatches: Counter,
    pub layer_files: CacheMetrics,
    pub compactions: Counter,
    pub compaction_bytes_read: Counter,
    pub compaction_bytes_written: Counter,
    pub image_layers_created: Counter,
    pub image_bytes_written: Counter,
    pub compaction_errors: Counter,
    pub l0_layers: Gauge,
    pub l1_layers: Gauge,
    pub image_layers: Gauge,
    pub backpressure_timelines: Gauge,
    pub gc_layers_removed: Counter,
    pub gc_bytes_removed: Counter,
    pub layers_uploaded: Counter,
    pub upload_bytes: Counter,
    pub indexes_uploaded: Counter,
    pub upload_errors: Counter,
    pub upload_lag_bytes: Gauge,
    pub upload_queue_layers: Gauge,
    pub layers_downloaded: Counter,
    pub download_bytes: Counter,
    pub download_errors: Counter,
    pub layers_evicted: Counter,
    pub local_layer_bytes: Gauge,
    pub remote_deletions: Counter,
    pub remote_deletions_refused: Counter,
    pub upload_backpressure_timelines: Gauge,
    listeners: ListenerMetrics,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("strata_pageserver");
        let m = Metrics {
            wal_bytes_ingested: Counter::default(),
            records_ingested: Counter::default(),
            layers_flushed: Counter::default(),
            layer_bytes_written: Counter::default(),
            getpage_requests: Counter::default(),
            getpage_batches: Counter::default(),
            getpage_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 8)),
            read_layers_visited: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            request_seconds: Histogram::new(exponential_buckets(0.00001, 2.0, 20)),
            request_errors: Counter::default(),
            page_connections: Gauge::default(),
            basebackups: Counter::default(),
            walreceiver_connects: Counter::default(),
            wal_segments_from_object_storage: Counter::default(),
            timelines_broken: Gauge::default(),
            timeline_reloads: Counter::default(),
            redo_records_stored: Counter::default(),
            redo_pages_materialized: Counter::default(),
            redo_records_applied: Counter::default(),
            rebuilt_page_hits: Counter::default(),
            redo_blocks_verified: Counter::default(),
            redo_mismatches: Counter::default(),
            layer_files: CacheMetrics::default(),
            compactions: Counter::default(),
            compaction_bytes_read: Counter::default(),
            compaction_bytes_written: Counter::default(),
            image_layers_created: Counter::default(),
            image_bytes_written: Counter::default(),
            compaction_errors: Counter::default(),
            l0_layers: Gauge::default(),
            l1_layers: Gauge::default(),
            image_layers: Gauge::default(),
            backpressure_timelines: Gauge::default(),
            gc_layers_removed: Counter::default(),
            gc_bytes_removed: Counter::default(),
            layers_uploaded: Counter::default(),
            upload_bytes: Counter::default(),
            indexes_uploaded: Counter::default(),
            upload_errors: Counter::default(),
            upload_lag_bytes: Gauge::default(),
            upload_queue_layers: Gauge::default(),
            layers_downloaded: Counter::default(),
            download_bytes: Counter::default(),
            download_errors: Counter::default(),
            layers_evicted: Counter::default(),
            local_layer_bytes: Gauge::default(),
            remote_deletions: Counter::default(),
            remote_deletions_refused: Counter::default(),
            upload_backpressure_timelines: Gauge::default(),
            listeners: ListenerMetrics::default(),
            registry: Registry::default(),
        };
        registry.register("wal_bytes_ingested", "WAL bytes decoded and ingested", m.wal_bytes_ingested.clone());
        registry.register("records_ingested", "WAL records ingested", m.records_ingested.clone());
        registry.register("layers_flushed", "In-memory layers written to layer files", m.layers_flushed.clone());
        registry.register("layer_bytes_written", "Bytes of layer files written", m.layer_bytes_written.clone());
        registry.register("getpage_requests", "GetPage requests served", m.getpage_requests.clone());
        registry.register("getpage_batches", "Batched lookups serving GetPage requests", m.getpage_batches.clone());
        registry.register("getpage_batch_size", "GetPage requests per batched lookup", m.getpage_batch_size.clone());
        registry.register(
            "read_layers_visited",
            "Layers (in memory and files) a read of one key searched until it had every version it needed",
            m.read_layers_visited.clone(),
        );
        registry.register("request_seconds", "Page service request latency", m.request_seconds.clone());
        registry.register("request_errors", "Page service requests answered with an error", m.request_errors.clone());
        registry.register("page_connections", "Open page service connections", m.page_connections.clone());
        registry.register("basebackups", "Basebackups served", m.basebackups.clone());
        registry.register("walreceiver_connects", "Connections made to safekeepers", m.walreceiver_connects.clone());
        registry.register(
            "wal_segments_from_object_storage",
            "WAL segments read from object storage because the safekeepers had removed them",
            m.wal_segments_from_object_storage.clone(),
        );
        registry.register(
            "timelines_broken",
            "Timelines stopped by an error (see their status)",
            m.timelines_broken.clone(),
        );
        registry.register("timeline_reloads", "Broken timelines re-read from disk", m.timeline_reloads.clone());
        registry.register(
            "redo_records_stored",
            "Block changes stored as WAL records for native redo (no image)",
            m.redo_records_stored.clone(),
        );
        registry.register(
            "redo_pages_materialized",
            "Pages written as images by ingest to keep redo chains short",
            m.redo_pages_materialized.clone(),
        );
        registry.register(
            "redo_records_applied",
            "Stored changes applied to rebuild pages that were read",
            m.redo_records_applied.clone(),
        );
        registry.register(
            "rebuilt_page_hits",
            "Page reads that started from a page rebuilt by an earlier read",
            m.rebuilt_page_hits.clone(),
        );
        registry.register(
            "redo_blocks_verified",
            "Blocks whose native redo was compared with PostgreSQL's image (verify_redo)",
            m.redo_blocks_verified.clone(),
        );
        registry.register(
            "redo_mismatches",
            "Blocks whose native redo differed from PostgreSQL's image (verify_redo)",
            m.redo_mismatches.clone(),
        );
        registry.register("layer_files_open", "Layer files open in the descriptor cache", m.layer_files.open.clone());
        registry.register(
            "layer_file_opens",
            "Layer files opened by the descriptor cache",
            m.layer_files.opens.clone(),
        );
        registry.register(
            "layer_file_evictions",
            "Layer files closed to stay within max_open_layer_files",
            m.layer_files.evictions.clone(),
        );
        registry.register("compactions", "L0 compactions finished", m.compactions.clone());
        registry.register(
            "compaction_bytes_read",
            "Stored bytes of L0 deltas read by compaction",
            m.compaction_bytes_read.clone(),
        );
        registry.register(
            "compaction_bytes_written",
            "Bytes of L1 delta files written by compaction",
            m.compaction_bytes_written.clone(),
        );
        registry.register("image_layers_created", "Image layer files written", m.image_layers_created.clone());
        registry.register("image_bytes_written", "Bytes of image layer files written", m.image_bytes_written.clone());
        registry.register(
            "compaction_errors",
            "Compactions and image creations that failed (retried later)",
            m.compaction_errors.clone(),
        );
        registry.register("l0_layers", "L0 delta layers of all timelines", m.l0_layers.clone());
        registry.register("l1_layers", "L1 delta layers of all timelines", m.l1_layers.clone());
        registry.register("image_layers", "Image layers of all timelines", m.image_layers.clone());
        registry.register(
            "backpressure_timelines",
            "Timelines whose ingest is slowed because L0 deltas wait for compaction",
            m.backpressure_timelines.clone(),
        );
        registry.register(
            "gc_layers_removed",
            "Layer files removed by garbage collection",
            m.gc_layers_removed.clone(),
        );
        registry.register(
            "gc_bytes_removed",
            "Bytes of layer files removed by garbage collection",
            m.gc_bytes_removed.clone(),
        );
        registry.register("layers_uploaded", "Layer files uploaded to remote storage", m.layers_uploaded.clone());
        registry.register("upload_bytes", "Bytes of layer files uploaded", m.upload_bytes.clone());
        registry.register("indexes_uploaded", "Index manifests uploaded", m.indexes_uploaded.clone());
        registry.register(
            "upload_errors",
            "Uploads to remote storage that failed (retried with backoff)",
            m.upload_errors.clone(),
        );
        registry.register(
            "upload_lag_bytes",
            "Bytes of layer files of all timelines not yet in remote storage",
            m.upload_lag_bytes.clone(),
        );
        registry.register(
            "upload_queue_layers",
            "Layer files of all timelines waiting to be uploaded",
            m.upload_queue_layers.clone(),
        );
        registry.register("layers_downloaded", "Layer files downloaded on demand", m.layers_downloaded.clone());
        registry.register("download_bytes", "Bytes of layer files downloaded", m.download_bytes.clone());
        registry.register("download_errors", "On-demand downloads that failed", m.download_errors.clone());
        registry.register(
            "layers_evicted",
            "Layer files evicted from local disk (kept in remote storage)",
            m.layers_evicted.clone(),
        );
        registry.register(
            "local_layer_bytes",
            "Bytes of layer files on local disk, all timelines",
            m.local_layer_bytes.clone(),
        );
        registry.register(
            "remote_deletions",
            "Objects deleted from remote storage through the deletion queue",
            m.remote_deletions.clone(),
        );
        registry.register(
            "remote_deletions_refused",
            "Queued deletions dropped because their generation is no longer current",
            m.remote_deletions_refused.clone(),
        );
        registry.register(
            "upload_backpressure_timelines",
            "Timelines whose ingest is slowed because uploads lag more than max_upload_lag_bytes",
            m.upload_backpressure_timelines.clone(),
        );
        let listeners = ListenerMetrics::register(&mut registry);
        Metrics { registry, listeners, ..m }
    }

    /// The connection metrics of the listeners.
    pub fn listener_metrics(&self) -> ListenerMetrics {
        self.listeners.clone()
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
