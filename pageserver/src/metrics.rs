//! Prometheus metrics of the pageserver.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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
    pub request_seconds: Histogram,
    pub request_errors: Counter,
    pub page_connections: Gauge,
    pub basebackups: Counter,
    pub walreceiver_connects: Counter,
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
            request_seconds: Histogram::new(exponential_buckets(0.00001, 2.0, 20)),
            request_errors: Counter::default(),
            page_connections: Gauge::default(),
            basebackups: Counter::default(),
            walreceiver_connects: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("wal_bytes_ingested", "WAL bytes decoded and ingested", m.wal_bytes_ingested.clone());
        registry.register("records_ingested", "WAL records ingested", m.records_ingested.clone());
        registry.register("layers_flushed", "In-memory layers written to layer files", m.layers_flushed.clone());
        registry.register("layer_bytes_written", "Bytes of layer files written", m.layer_bytes_written.clone());
        registry.register("getpage_requests", "GetPage requests served", m.getpage_requests.clone());
        registry.register("getpage_batches", "Batched lookups serving GetPage requests", m.getpage_batches.clone());
        registry.register("getpage_batch_size", "GetPage requests per batched lookup", m.getpage_batch_size.clone());
        registry.register("request_seconds", "Page service request latency", m.request_seconds.clone());
        registry.register("request_errors", "Page service requests answered with an error", m.request_errors.clone());
        registry.register("page_connections", "Open page service connections", m.page_connections.clone());
        registry.register("basebackups", "Basebackups served", m.basebackups.clone());
        registry.register("walreceiver_connects", "Connections made to safekeepers", m.walreceiver_connects.clone());
        Metrics { registry, ..m }
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
