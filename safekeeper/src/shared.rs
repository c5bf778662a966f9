//! What the connections and tasks of a safekeeper share: its
//! configuration, clock, timelines, metrics, what it knows of its peers and its
//! object storage. It sits below the modules that use it, so that none of
//! them depends on another only to reach this, and above what it holds: the
//! tasks whose results it holds (the peers' poller, each timeline's
//! `manager`) are given their inputs instead, so that none of them needs it.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::Mutex;
use strata_service::clock::Clock;

use crate::config::SafekeeperConfig;
use crate::metrics::Metrics;
use crate::peers::PeerViews;
use crate::timelines::Timelines;

/// Shared state of all connections.
pub struct Shared {
    pub config: SafekeeperConfig,
    pub timelines: Arc<Timelines>,
    pub metrics: Arc<Metrics>,
    /// Numbers consumer connections (their key in a timeline's consumer list).
    pub next_connection_id: AtomicU64,
    /// The peers' positions, as they last answered.
    pub peers: Arc<PeerViews>,
    /// Where WAL is offloaded to and recovered from, if anywhere.
    pub remote: Option<strata_remote_storage::RemoteStorage>,
    /// This safekeeper's own token, sent to its peers (never logged).
    pub token: Option<strata_service::auth::Token>,
    /// Trust for calls to peers over TLS; none: they are plaintext.
    pub tls: Option<strata_service::tls::ClientTls>,
    /// Checks callers' tokens; none: every caller is accepted.
    pub verifier: Option<Arc<strata_service::auth::Verifier>>,
    /// Where every timeout, keepalive, retry and measured duration reads the time.
    pub clock: Arc<dyn Clock>,
    /// Held through a metrics scrape (`render_metrics`).
    pub scrape: Mutex<()>,
}

impl Shared {
    /// The metrics in Prometheus text format, with the per-tenant series of
    /// the timelines held now. One scrape at a time: another one's refill
    /// would otherwise empty the family under this one's render.
    pub fn render_metrics(&self) -> String {
        let _one_at_a_time = self.scrape.lock();
        self.metrics.set_tenant_wal_bytes(&self.timelines.wal_bytes_by_tenant());
        self.metrics.render()
    }
}
