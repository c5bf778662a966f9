//! Prometheus metrics of the link proxy.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

strata_service::declare_metrics! {
    /// What crossed the links, over all routes (each route's own figures are in the status).
    pub struct Metrics in "strata_link_proxy" {
        connections: Gauge => "Relayed connections open",
        connections_refused: Counter => "Connections closed at once: the route had max_connections",
        connect_errors: Counter => "Connections to a route's target that failed",
        relayed_bytes: Counter => "Bytes delivered, both directions",
        resets: Counter => "Connections reset by a request",
    }
}
