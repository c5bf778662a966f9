//! Prometheus metrics of the safekeeper.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use strata_service::ListenerMetrics;

/// Counters and histograms shared by all connections.
pub struct Metrics {
    registry: Registry,
    pub append_requests: Counter,
    pub append_bytes: Counter,
    pub flushes: Counter,
    pub flush_seconds: Histogram,
    pub appends_per_flush: Histogram,
    pub proposer_connections: Gauge,
    pub consumer_connections: Gauge,
    pub sent_bytes: Counter,
    pub protocol_errors: Counter,
    pub storage_errors: Counter,
    pub timelines_failed: Gauge,
    pub timeline_failures: Counter,
    pub timeline_reloads: Counter,
    pub segments_offloaded: Counter,
    /// Archived segments deleted from object storage past their retention.
    pub archived_segments_expired: Counter,
    /// Partial segments uploaded (the committed part of a segment being written).
    pub partial_segments_offloaded: Counter,
    /// Segments a far-behind timeline took from object storage (its peers had removed them).
    pub segments_recovered_from_object_storage: Counter,
    pub offload_bytes: Counter,
    pub offload_errors: Counter,
    pub segments_removed: Counter,
    pub local_wal_bytes: Gauge,
    listeners: ListenerMetrics,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("strata_safekeeper");
        let m = Metrics {
            append_requests: Counter::default(),
            append_bytes: Counter::default(),
            flushes: Counter::default(),
            flush_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
            appends_per_flush: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            proposer_connections: Gauge::default(),
            consumer_connections: Gauge::default(),
            sent_bytes: Counter::default(),
            protocol_errors: Counter::default(),
            storage_errors: Counter::default(),
            timelines_failed: Gauge::default(),
            timeline_failures: Counter::default(),
            timeline_reloads: Counter::default(),
            segments_offloaded: Counter::default(),
            archived_segments_expired: Counter::default(),
            partial_segments_offloaded: Counter::default(),
            segments_recovered_from_object_storage: Counter::default(),
            offload_bytes: Counter::default(),
            offload_errors: Counter::default(),
            segments_removed: Counter::default(),
            local_wal_bytes: Gauge::default(),
            listeners: ListenerMetrics::default(),
            registry: Registry::default(),
        };
        registry.register("append_requests", "WAL append requests received", m.append_requests.clone());
        registry.register("append_bytes", "WAL bytes received from proposers", m.append_bytes.clone());
        registry.register("flushes", "WAL flushes (fsync batches)", m.flushes.clone());
        registry.register("flush_seconds", "Time to make a batch of appends durable", m.flush_seconds.clone());
        registry.register("appends_per_flush", "Append requests covered by one flush", m.appends_per_flush.clone());
        registry.register("proposer_connections", "Open proposer connections", m.proposer_connections.clone());
        registry.register("consumer_connections", "Open WAL consumer connections", m.consumer_connections.clone());
        registry.register("sent_bytes", "WAL bytes sent to consumers", m.sent_bytes.clone());
        registry.register("protocol_errors", "Connections closed for protocol violations", m.protocol_errors.clone());
        registry.register("storage_errors", "Requests failed by storage errors", m.storage_errors.clone());
        registry.register(
            "timelines_failed",
            "Timelines that stopped accepting after a storage error or a panic, until re-read from disk",
            m.timelines_failed.clone(),
        );
        registry.register("timeline_failures", "Times a timeline stopped accepting", m.timeline_failures.clone());
        registry.register("timeline_reloads", "Failed timelines re-read from disk", m.timeline_reloads.clone());
        registry.register(
            "segments_offloaded",
            "WAL segments uploaded to object storage",
            m.segments_offloaded.clone(),
        );
        registry.register(
            "segments_recovered_from_object_storage",
            "WAL segments recovered from object storage because the peers had removed them",
            m.segments_recovered_from_object_storage.clone(),
        );
        registry.register(
            "partial_segments_offloaded",
            "Partial WAL segments uploaded (committed WAL of a segment not yet complete)",
            m.partial_segments_offloaded.clone(),
        );
        registry.register(
            "archived_segments_expired",
            "Offloaded WAL segments deleted from object storage past wal_archive_retention",
            m.archived_segments_expired.clone(),
        );
        registry.register("offload_bytes", "WAL bytes uploaded to object storage", m.offload_bytes.clone());
        registry.register(
            "offload_errors",
            "Failed rounds of WAL offload (retried a second later)",
            m.offload_errors.clone(),
        );
        registry.register("segments_removed", "Local WAL segments removed", m.segments_removed.clone());
        registry.register("local_wal_bytes", "Bytes of WAL segments held on local disk", m.local_wal_bytes.clone());
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
