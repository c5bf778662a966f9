//! The storage controller (`docs/storage-controller.md`): places each
//! tenant's attached location and a warm secondary on the pageservers,
//! heartbeats them, attaches the secondary under a new generation when the
//! attached one stops answering, moves tenants live for drains and
//! rebalancing, and tells the computes where their pages are. Its state is
//! one object in object storage, written by compare-and-swap; several
//! controllers run, and the holder of a lease object leads.
//!
//! Time, storage, pageserver calls and randomness come in through
//! [`env::Env`]: the process gives it the real ones, the simulation
//! (`tests/simulation.rs`) fakes driven by one seed.

pub mod client;
pub mod config;
pub mod env;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod renew;
pub mod retry;
pub mod schedule;
pub mod service;
pub mod split;
pub mod store;
pub mod tasks;

use std::sync::Arc;

use strata_service::start::{bind, http_listener, serve_http, stop_signal, Security};

/// Why the controller could not start (every service's start-up error).
pub use strata_service::start::StartError;

/// Runs the controller until SIGTERM/SIGINT.
pub async fn run(config: config::ControllerConfig) -> Result<(), StartError> {
    config.validate()?;
    let http = bind("listen_http", config.listen_http).await?;
    let shutdown = stop_signal()?;
    let metrics = Arc::new(metrics::Metrics::new());
    let security = Security::load("controller", config.tls.as_ref(), config.auth.as_ref())?;
    let auth = security.http_auth(metrics.refusal_metrics());
    let store = store::Store::open(&config.remote_storage).map_err(|e| StartError::service("object storage", e))?;
    let client = client::Client::new(
        security.client_tls.as_ref(),
        security.token.clone(),
        config.heartbeat_interval.max(limits::MIN_HEARTBEAT_TIMEOUT),
    );
    let listener = http_listener(
        http,
        config.max_http_connections,
        limits::HTTP_HANDSHAKE_TIMEOUT,
        &metrics.listener_metrics(),
        &security,
    );
    tracing::info!(id = config.id, http = %config.listen_http, storage = %store.describe(), "storage controller started");
    // Renewal needs the callers' tokens checked: only with auth.
    let renewer = match (&config.issuer_key, &security.verifier) {
        (Some(key), Some(verifier)) => {
            Some(Arc::new(renew::Renewer { verifier: verifier.clone(), issuer_key: key.clone() }))
        }
        _ => None,
    };
    let controller = service::Controller::new(config, env::Env::production(store, client), metrics);
    let router = http::router(controller.clone(), auth.as_ref(), renewer);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(serve_http(listener, router));
    tasks.spawn(controller.run());
    shutdown.await;
    tasks.abort_all();
    tracing::info!("storage controller stopped");
    Ok(())
}
