//! What every connection of the proxy shares: its configuration, the
//! control plane, the tables of wakes, sessions per tenant and cancel keys.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use strata_service::tls::{ClientTls, ServerTls};

use crate::admission::Admission;
use crate::cancel::Cancels;
use crate::catalog::{Backend, Target};
use crate::config::ProxyConfig;
use crate::limits::MAX_LOOKUPS_IN_FLIGHT;
use crate::metrics::Metrics;
use crate::refusal::{self as why, Refusal};
use crate::wake::Wakes;

/// What every connection of the proxy shares.
pub struct Proxy {
    pub config: ProxyConfig,
    pub backend: Arc<dyn Backend>,
    pub metrics: Arc<Metrics>,
    pub wakes: Arc<Wakes>,
    pub admission: Arc<Admission>,
    pub cancels: Arc<Cancels>,
    /// The certificate clients are served, if the proxy speaks TLS.
    pub server_tls: Option<ServerTls>,
    /// The trust of the computes' certificates, if the cluster has a CA.
    pub compute_tls: Option<ClientTls>,
    /// Bounds the catalog lookups running at once.
    lookups: tokio::sync::Semaphore,
    /// Refusals by reason since the start (the status's copy of the metric).
    pub(crate) refusals: Mutex<BTreeMap<&'static str, u64>>,
    /// Seeds the decoy verifiers of unknown endpoints: the same name gets
    /// the same salt within a run, as a real endpoint would.
    pub(crate) decoy_secret: [u8; 32],
    /// The bound addresses.
    pub pg: SocketAddr,
    pub http: SocketAddr,
}

impl Proxy {
    /// The state of a proxy with these listeners' addresses `(pg, http)`.
    pub fn new(
        config: ProxyConfig,
        backend: Arc<dyn Backend>,
        metrics: Arc<Metrics>,
        (server_tls, compute_tls): (Option<ServerTls>, Option<ClientTls>),
        decoy_secret: [u8; 32],
        (pg, http): (SocketAddr, SocketAddr),
    ) -> Proxy {
        Proxy {
            admission: Admission::new(config.max_connections_per_tenant),
            config,
            backend,
            metrics,
            wakes: Arc::default(),
            cancels: Arc::default(),
            server_tls,
            compute_tls,
            lookups: tokio::sync::Semaphore::new(MAX_LOOKUPS_IN_FLIGHT),
            refusals: Mutex::default(),
            decoy_secret,
            pg,
            http,
        }
    }

    /// Counts a refusal for the metrics and the status.
    pub fn refused(&self, reason: &'static str) {
        self.metrics.refuse(reason);
        *self.refusals.lock().entry(reason).or_default() += 1;
    }

    /// The endpoint named `name` (on a blocking thread, bounded).
    pub async fn lookup(&self, name: &str) -> Result<Option<Target>, Refusal> {
        let _permit = self.lookups.acquire().await.expect("the semaphore is never closed");
        let (backend, owned) = (self.backend.clone(), name.to_string());
        let found = tokio::task::spawn_blocking(move || backend.lookup(&owned)).await;
        found.unwrap_or_else(|e| Err(e.to_string())).map_err(|e| {
            tracing::error!(endpoint = name, "looking the endpoint up: {e}");
            Refusal::new(why::CATALOG, "XX000", "the proxy cannot read the cluster's endpoints now")
        })
    }
}
