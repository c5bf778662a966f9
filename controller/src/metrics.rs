//! Prometheus metrics of the storage controller.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

strata_service::declare_metrics! {
    /// What the controller decided and how its writes went.
    pub struct Metrics in "strata_controller" {
        leader: Gauge => "1 while this controller holds the leader's lease",
        leader_term: Gauge => "The term of the leader this controller knows",
        takeovers: Counter => "Times this controller took the leader's lease",
        state_writes: Counter => "State objects written",
        state_conflicts: Counter => "State writes refused because another write came first",
        storage_errors: Counter => "Reads and writes of the state or the lease that failed",
        heartbeat_failures: Counter => "Heartbeats a pageserver did not answer",
        pageservers_online: Gauge => "Pageservers answering heartbeats",
        failovers: Counter => "Tenants attached elsewhere because their pageserver went offline",
        migrations_started: Counter => "Live moves of a tenant started (drains, rebalancing)",
        migrations_completed: Counter => "Live moves of a tenant completed",
        location_calls: Counter => "Location changes sent to pageservers",
        location_errors: Counter => "Location changes that failed",
    }
}
