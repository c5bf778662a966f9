//! Prometheus metrics of the proxy.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// Why a client was turned away.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: &'static str,
}

strata_service::declare_metrics! {
    /// What the proxy did.
    pub struct Metrics in "strata_proxy" {
        sessions: Gauge => "Client sessions relayed to computes now",
        sessions_started: Counter => "Client sessions that reached their compute",
        refused: Family<Reason, Counter> => "Clients turned away, by reason",
        wakes: Counter => "Sleeping computes woken",
        wake_failures: Counter => "Wakes that failed",
        wake_seconds: Histogram = Histogram::new(exponential_buckets(0.05, 2.0, 10)) => "Time to wake a compute",
        cancels: Counter => "Cancel requests passed on to a compute",
        relayed_bytes: Counter => "Bytes relayed between clients and computes, both ways, of sessions ended",
    }
}

impl Metrics {
    /// Counts a refusal.
    pub fn refuse(&self, reason: &'static str) {
        self.refused.get_or_create(&Reason { reason }).inc();
    }
}
