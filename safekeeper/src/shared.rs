//! What every task and connection of a safekeeper shares: its
//! configuration, timelines, metrics, what it knows of its peers and its
//! object storage. It sits below the modules that use it, so that none of
//! them depends on another only to reach this.

use std::sync::atomic::AtomicU64;

use crate::config::SafekeeperConfig;
use crate::metrics::Metrics;
use crate::peers::PeerViews;
use crate::timelines::Timelines;

/// Shared state of all connections.
pub struct Shared {
    pub config: SafekeeperConfig,
    pub timelines: Timelines,
    pub metrics: Metrics,
    /// Numbers consumer connections (their key in a timeline's consumer list).
    pub next_connection_id: AtomicU64,
    /// The peers' positions, as they last answered.
    pub peers: PeerViews,
    /// Where WAL is offloaded to and recovered from, if anywhere.
    pub remote: Option<strata_remote_storage::RemoteStorage>,
    /// This safekeeper's own token, sent to its peers (never logged).
    pub token: Option<strata_service::auth::Token>,
    /// Trust for calls to peers over TLS; none: they are plaintext.
    pub tls: Option<strata_service::tls::ClientTls>,
    /// Checks callers' tokens; none: every caller is accepted.
    pub verifier: Option<std::sync::Arc<strata_service::auth::Verifier>>,
}
