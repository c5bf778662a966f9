//! Prometheus metrics of the safekeeper.

use std::collections::BTreeMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use strata_protocol::TenantId;

strata_service::declare_metrics! {
    /// Counters and histograms shared by all connections.
    pub struct Metrics in "strata_safekeeper" {
        append_requests: Counter => "WAL append requests received",
        append_bytes: Counter => "WAL bytes received from proposers",
        flushes: Counter => "WAL flushes (fsync batches)",
        flush_seconds: Histogram = Histogram::new(exponential_buckets(0.00005, 2.0, 16)) => "Time to make a batch of appends durable",
        appends_per_flush: Histogram = Histogram::new(exponential_buckets(1.0, 2.0, 12)) => "Append requests covered by one flush",
        proposer_connections: Gauge => "Open proposer connections",
        consumer_connections: Gauge => "Open WAL consumer connections",
        stale_consumers_refused: Counter => "Stream requests refused because a pageserver of a newer attachment generation has streamed the timeline",
        stale_streams_ended: Counter => "Streams of a superseded attachment generation ended after the grace period",
        sent_bytes: Counter => "WAL bytes sent to consumers",
        decoded_wal_bytes: Counter => "WAL bytes read into decoded streams (each stream counts what it covered)",
        decoded_sent_bytes: Counter => "Bytes of decoded batches sent to consumers, compressed",
        decoded_batches: Counter => "Decoded batches sent to consumers",
        protocol_errors: Counter => "Connections closed for protocol violations",
        storage_errors: Counter => "Requests failed by storage errors",
        timelines_failed: Gauge => "Timelines that stopped accepting after a storage error or a panic, until re-read from disk",
        timeline_failures: Counter => "Times a timeline stopped accepting",
        timeline_reloads: Counter => "Failed timelines re-read from disk",
        segments_offloaded: Counter => "WAL segments uploaded to object storage",
        archived_segments_expired: Counter => "Offloaded WAL segments deleted from object storage past wal_archive_retention",
        partial_segments_offloaded: Counter => "Partial WAL segments uploaded (committed WAL of a segment not yet complete)",
        segments_recovered_from_object_storage: Counter => "WAL segments recovered from object storage because the peers had removed them",
        offload_bytes: Counter => "WAL bytes uploaded to object storage",
        offload_errors: Counter => "Failed rounds of WAL offload (retried a second later)",
        segments_removed: Counter => "Local WAL segments removed",
        local_wal_bytes: Gauge => "Bytes of WAL segments held on local disk",
        tenant_wal_bytes: Family<TenantLabel, Gauge> => "Bytes of WAL segments held on local disk for a tenant's timelines, as their removal last counted them",
    }
}

/// The series of one tenant. Its id is not a value a client chooses (the
/// tenant a proposer's greeting or a stream request names gets no series):
/// only tenants with a timeline here get one, and timelines are only
/// created through the HTTP API, by the operator's control plane or the
/// storage controller. The family is refilled from the timelines at every
/// scrape ([`Metrics::set_tenant_wal_bytes`]), so its size is bounded by
/// the tenants held here and a tenant whose timelines are deleted takes
/// its series with it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// The tenant id in hex.
    pub tenant: String,
}

impl Metrics {
    /// Replaces every tenant's series with `bytes`, the WAL bytes of the
    /// tenants held now. Cleared first: a tenant that is gone has no series
    /// left, rather than its last value forever.
    pub fn set_tenant_wal_bytes(&self, bytes: &BTreeMap<TenantId, u64>) {
        self.tenant_wal_bytes.clear();
        for (tenant, b) in bytes {
            let value = i64::try_from(*b).unwrap_or(i64::MAX);
            self.tenant_wal_bytes.get_or_create(&TenantLabel { tenant: tenant.to_string() }).set(value);
        }
    }
}
